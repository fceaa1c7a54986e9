"""Topology from Python: the parsed tree and settings, and ConfigError
messages that name the file, the node and the problem."""

import pytest

import fedwan

TEXT = """\
job: py-test
federation: {rounds: 3, inner_steps: 2, codec: fp32, chunk_bytes: 4096,
             round_timeout_s: 30, outer_optimizer: {name: diloco, lr: 0.5}}
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/fedwan-py-test/root.sock"}
  - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", bind: "tcp://*:7001"}
  - {id: site-0, role: site, parent: eu, weight: 3}
  - {id: site-1, role: site, parent: root, weight: 1}
"""


def test_parse_exposes_the_tree_and_the_settings():
    t = fedwan.Topology.parse(TEXT)
    assert t.job == "py-test"
    assert t.rounds == 3 and t.inner_steps == 2 and t.codec == "fp32"
    assert t.chunk_bytes == 4096 and t.round_timeout_s == 30
    assert t.outer_optimizer == "diloco"
    fed = t.federation
    assert (fed.rounds, fed.inner_steps, fed.codec) == (3, 2, "fp32")
    assert fed.outer_optimizer.name == "diloco"
    assert fed.outer_optimizer.lr == 0.5 and fed.outer_optimizer.momentum is None

    ids = [n.id for n in t.nodes]
    assert ids == ["root", "eu", "site-0", "site-1"]
    root, eu, s0, s1 = t.nodes
    assert (root.role, root.parent, root.index) == ("root", None, 0)
    assert root.endpoint == "ipc:///tmp/fedwan-py-test/root.sock"
    assert root.children == [1, 3]
    assert (eu.role, eu.parent, eu.bind, eu.children) == ("region", "root", "tcp://*:7001", [2])
    assert (s0.role, s0.parent, s0.weight, s0.index, s0.parent_index) == ("site", "eu", 3.0, 2, 1)
    assert s1.weight == 1.0 and s1.endpoint == ""
    assert t.root.id == "root"
    assert t.node("site-1").index == 3
    assert t.find("nobody") is None
    assert t.sites_under("root") == ["site-0", "site-1"]
    assert t.sites_under("eu") == ["site-0"]
    assert t.weight_under("root") == 4.0
    assert "site-0" in repr(s0) and "py-test" in repr(t)


def test_digest_is_stable_through_yaml_and_files(tmp_path):
    t = fedwan.Topology.parse(TEXT)
    assert len(t.digest_hex()) == 64 and t.digest.hex() == t.digest_hex()
    again = fedwan.Topology.parse(t.to_yaml())
    assert again.digest_hex() == t.digest_hex()
    path = tmp_path / "federation.yaml"
    path.write_text(TEXT)
    assert fedwan.Topology.load(path).digest_hex() == t.digest_hex()
    assert fedwan.Topology.load(str(path)).digest_hex() == t.digest_hex()
    changed = fedwan.Topology.parse(TEXT.replace("weight: 3", "weight: 2"))
    assert changed.digest_hex() != t.digest_hex()


BAD = [
    ("  - {id: site-1, role: site, parent: root, weight: 1}",
     "  - {id: site-0, role: site, parent: root, weight: 1}",
     ["fed.yaml", "site-0", "duplicate id"]),
    ("parent: root, weight: 1", "parent: nowhere, weight: 1",
     ["fed.yaml", "site-1", "parent 'nowhere' is not a node"]),
    ("endpoint: \"tcp", "endpiont: \"tcp", ["fed.yaml", "eu", "unknown key 'endpiont'"]),
    ("weight: 3", "weight: -3", ["site-0", "weight -3 must be > 0 and at most 1e+12"]),
    ("codec: fp32", "codec: int3", ["codec", "unknown codec 'int3'", "fp16"]),
    ("job: py-test", "job: [py-test", ["fed.yaml", "YAML syntax error"]),
]


@pytest.mark.parametrize("old,new,expected", BAD, ids=[
    "duplicate", "unknown-parent", "unknown-key", "bad-weight", "unknown-codec", "syntax"])
def test_invalid_topologies_raise_config_error_naming_the_problem(old, new, expected):
    assert old in TEXT
    with pytest.raises(fedwan.ConfigError) as info:
        fedwan.Topology.parse(TEXT.replace(old, new, 1), "fed.yaml")
    for text in expected:
        assert text in str(info.value)


def test_missing_file_and_missing_node(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(fedwan.ConfigError, match="cannot open topology file.*absent.yaml"):
        fedwan.Topology.load(missing)
    with pytest.raises(fedwan.ConfigError, match="'nobody' is not in topology 'py-test'"):
        fedwan.Topology.parse(TEXT).node("nobody")


def test_overlap_steps_and_tcp_congestion_settings():
    blocking = fedwan.Topology.parse(TEXT)
    assert blocking.overlap_steps == 0 and blocking.federation.overlap_steps == 0
    assert blocking.federation.tcp_congestion == "bbr"
    assert blocking.federation.socket_buffer_bytes == 0  # the kernel's autotuning
    assert blocking.federation.streams == 0  # auto: as many TCP connections as pay
    assert blocking.federation.max_streams == 32
    assert "streams" not in blocking.to_yaml()
    fixed = fedwan.Topology.parse(
        TEXT.replace("chunk_bytes: 4096,", "chunk_bytes: 4096, streams: 1, max_streams: 4,"))
    assert (fixed.federation.streams, fixed.federation.max_streams) == (1, 4)
    assert "streams: 1" in fixed.to_yaml() and fixed.digest_hex() != blocking.digest_hex()
    assert "overlap_steps" not in blocking.to_yaml()

    text = TEXT.replace("chunk_bytes: 4096,",
                        "chunk_bytes: 4096, overlap_steps: 2, tcp_congestion: cubic,")
    t = fedwan.Topology.parse(text)
    assert t.overlap_steps == 2 and t.federation.overlap_steps == 2
    assert t.federation.tcp_congestion == "cubic"
    assert "inner_steps=2, overlap_steps=2" in repr(t.federation)
    assert t.digest_hex() != blocking.digest_hex()
    # Through YAML and back: the same settings, the same digest.
    again = fedwan.Topology.parse(t.to_yaml())
    assert "overlap_steps: 2" in t.to_yaml()
    assert (again.overlap_steps, again.federation.tcp_congestion) == (2, "cubic")
    assert again.digest_hex() == t.digest_hex()

    buffered = fedwan.Topology.parse(
        TEXT.replace("chunk_bytes: 4096,", "chunk_bytes: 4096, socket_buffer_bytes: 4194304,"))
    assert buffered.federation.socket_buffer_bytes == 4194304
    with pytest.raises(fedwan.ConfigError, match="socket_buffer_bytes 100 is out of range"):
        fedwan.Topology.parse(
            TEXT.replace("chunk_bytes: 4096,", "chunk_bytes: 4096, socket_buffer_bytes: 100,"))

    striped = fedwan.Topology.parse(
        TEXT.replace("chunk_bytes: 4096,", "chunk_bytes: 4096, streams: 4,"))
    assert striped.federation.streams == 4
    assert striped.digest_hex() != blocking.digest_hex()
    assert fedwan.Topology.parse(striped.to_yaml()).federation.streams == 4
    with pytest.raises(fedwan.ConfigError, match="streams 17 is out of range"):
        fedwan.Topology.parse(TEXT.replace("chunk_bytes: 4096,", "chunk_bytes: 4096, streams: 17,"))

    with pytest.raises(fedwan.ConfigError, match="overlap_steps 3 is more than inner_steps 2"):
        fedwan.Topology.parse(text.replace("overlap_steps: 2", "overlap_steps: 3"), "fed.yaml")


def test_versions_expose_their_history_and_removed_sites():
    v1 = fedwan.Topology.parse(TEXT)
    assert (v1.version, v1.history, v1.signed) == (1, [], False)
    assert not any(n.removed for n in v1.nodes)
    v2_text = (TEXT.replace("job: py-test\n", "job: py-test\nversion: 2\nhistory: [\"%s\"]\n"
                            % v1.digest_hex())
               .replace("parent: root, weight: 1}", "parent: root, weight: 1, removed: true}")
               + "  - {id: site-2, role: site, parent: root, weight: 2}\n")
    v2 = fedwan.Topology.parse(v2_text)
    assert (v2.version, v2.history, v2.signed) == (2, [v1.digest_hex()], False)
    assert v2.digest_hex() != v1.digest_hex()
    assert v2.node("site-1").removed and v2.node("site-1").index == 3
    assert v2.sites_under("root") == ["site-0", "site-2"]
    assert v2.weight_under("root") == 5.0
    # A version lists exactly the digests of the versions before it.
    with pytest.raises(fedwan.ConfigError, match="history"):
        fedwan.Topology.parse(v2_text.replace("version: 2", "version: 3"))


def test_an_aggregator_may_carry_its_own_aggregation_settings():
    text = TEXT.replace(
        'bind: "tcp://*:7001"}',
        'bind: "tcp://*:7001", aggregation: {rule: median, norm_bound: {action: clip}}}')
    t = fedwan.Topology.parse(text)
    eu = t.node("eu")
    assert eu.aggregation is not None
    assert eu.aggregation["rule"] == "median"
    assert eu.aggregation["norm_bound"]["action"] == "clip"
    # The rest is the federation's.
    assert eu.aggregation["max_abs"] == t.federation.aggregation["max_abs"]
    assert t.node("root").aggregation is None
    assert t.aggregation("eu")["rule"] == "median"
    assert t.aggregation("root")["rule"] == "weighted_mean"
    assert t.digest != fedwan.Topology.parse(TEXT).digest
    assert fedwan.Topology.parse(t.to_yaml()).digest == t.digest
    with pytest.raises(fedwan.ConfigError, match="nobody"):
        t.aggregation("nobody")
    with pytest.raises(fedwan.ConfigError, match="aggregators only"):
        fedwan.Topology.parse(TEXT.replace("weight: 3}", "weight: 3, aggregation: {rule: median}}"))
