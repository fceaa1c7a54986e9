"""Link security from Python: provisioning, encrypted-by-default nodes, mutual
TLS federations, explicit plaintext, refusals across modes, and audit logs."""

import hashlib
import json
import math
import os

import numpy as np
import pytest

import fedwan
from helpers import JOIN_TIMEOUT_S, ROUND_TIMEOUT_S, Worker, join_all, topology_yaml

ROUNDS, INNER_STEPS, N, SEED = 3, 2, 2000, 7
SITES = ("site-0", "site-1")


def two_site_topology(sock_dir, job):
    return fedwan.Topology.parse(topology_yaml(
        job, sock_dir, [(s, "root", 1) for s in SITES], rounds=ROUNDS, inner_steps=INNER_STEPS))


def run_federation(topo, security):
    """Root and both sites as threads on the synthetic workload, every node
    built with the keyword arguments `security(node_id)`. Returns the root's
    summary and each site's final parameters."""
    initial = fedwan.synthetic_initial_model(N, SEED)

    def site(node_id):
        params = initial.copy()
        core = fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                               round_timeout_s=ROUND_TIMEOUT_S, **security(node_id))
        core.join()
        while not core.finished:
            fedwan.synthetic_local_steps(params, topo.node(node_id).index, INNER_STEPS, SEED)
            core.sync()
        return params

    root = fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                             round_timeout_s=ROUND_TIMEOUT_S, **security("root"))
    workers = [Worker("root", root.run)] + [Worker(s, lambda s=s: site(s)) for s in SITES]
    for w in workers:
        w.start()
    join_all(workers)
    return workers[0].result, [w.result for w in workers[1:]]


def reference_global_model(topo):
    """FedAvg of equal-weight sites in fp32 NumPy, as the root computes it."""
    want = fedwan.synthetic_initial_model(N, SEED)
    for _ in range(ROUNDS):
        deltas = []
        for s in SITES:
            local = want.copy()
            fedwan.synthetic_local_steps(local, topo.node(s).index, INNER_STEPS, SEED)
            deltas.append(want - local)
        want = want - (deltas[0] + deltas[1]) / np.float32(2)
    return want


def assert_trained_like_the_reference(topo, summary, site_params):
    got = summary["global_model"]
    np.testing.assert_allclose(got, reference_global_model(topo), rtol=0, atol=1e-6)
    assert summary["rounds"] == ROUNDS and summary["rejected_frames"] == 0
    for params in site_params:
        assert np.array_equal(params, got)


def test_provision_credentials_writes_one_bundle_per_node(sock_dir, tmp_path):
    topo = two_site_topology(sock_dir, "py-pki")
    topo_path = tmp_path / "federation.yaml"
    topo_path.write_text(topo.to_yaml())
    pki = tmp_path / "pki"
    fedwan.provision_credentials(topo_path, pki)  # a topology path works like a Topology
    assert os.path.isdir(pki / "ca")
    for node in ("root",) + SITES:
        bundle = fedwan.credentials_path(pki, node)
        assert bundle == os.path.join(str(pki), node)
        for name in ("ca.pem", "cert.pem", "key.pem", "crl.pem"):
            assert os.path.isfile(os.path.join(bundle, name)), (node, name)
    # Provisioning again would replace the CA under every issued bundle.
    cert = (pki / "site-0" / "cert.pem").read_bytes()
    with pytest.raises(fedwan.ConfigError, match="already exists"):
        fedwan.provision_credentials(topo, pki)
    assert (pki / "site-0" / "cert.pem").read_bytes() == cert
    fedwan.provision_credentials(topo, str(pki), validity_days=2, overwrite=True)
    assert (pki / "site-0" / "cert.pem").read_bytes() != cert
    with pytest.raises(fedwan.ConfigError, match="validity_days must be >= 1"):
        fedwan.provision_credentials(topo, tmp_path / "other", validity_days=0)
    with pytest.raises(fedwan.ConfigError, match="directory must be a str or os.PathLike"):
        fedwan.provision_credentials(topo, 42)
    for name in ("provision_credentials", "credentials_path"):
        assert name in fedwan.__all__ and getattr(fedwan, name).__doc__


def test_nodes_without_credentials_are_refused(sock_dir):
    topo = two_site_topology(sock_dir, "py-nocreds")
    with pytest.raises(fedwan.ConfigError, match="'site-0' has no credentials"):
        fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32))
    with pytest.raises(fedwan.ConfigError, match="'root' has no credentials"):
        fedwan.Aggregator(topo, "root", np.zeros(8, np.float32))
    torch = pytest.importorskip("torch")
    with pytest.raises(fedwan.ConfigError, match="'site-1' has no credentials"):
        fedwan.Site(topo, "site-1", torch.nn.Linear(2, 2).parameters())


def test_security_options_are_checked(sock_dir, credentials):
    topo = two_site_topology(sock_dir, "py-secopts")
    params = np.zeros(8, np.float32)
    with pytest.raises(fedwan.ConfigError, match="both credentials and insecure_plaintext"):
        fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-0"),
                        insecure_plaintext=True)
    with pytest.raises(fedwan.ConfigError, match="unknown cipher 'rot13'.*chacha20-poly1305"):
        fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-0"),
                        cipher="rot13")
    with pytest.raises(fedwan.ConfigError, match="are for site 'site-1'.*use this node's own"):
        fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-1"))
    with pytest.raises(fedwan.ConfigError, match="are for site 'site-0'.*not for root 'root'"):
        fedwan.Aggregator(topo, "root", params, credentials=credentials(topo, "site-0"))
    with pytest.raises(fedwan.ConfigError, match="credentials must be a str or os.PathLike"):
        fedwan.Aggregator(topo, "root", params, credentials=42)
    with pytest.raises(fedwan.ConfigError, match="audit_log must be a str or os.PathLike"):
        fedwan.Aggregator(topo, "root", params, credentials=credentials(topo, "root"),
                          audit_log=b"audit.jsonl")
    with pytest.raises(TypeError):
        fedwan.SiteCore(topo, "site-0", params, 10.0, None)  # the options are keyword-only


@pytest.mark.parametrize("cipher", ["aes-256-gcm", "chacha20-poly1305"])
def test_secure_federation_trains_over_mutual_tls(sock_dir, credentials, cipher):
    topo = two_site_topology(sock_dir, "py-mtls")
    summary, site_params = run_federation(
        topo, lambda node: {"credentials": credentials(topo, node), "cipher": cipher})
    assert_trained_like_the_reference(topo, summary, site_params)
    assert summary["security_mode"].startswith("mtls")
    assert summary["security_mode"] == f"mtls/{cipher}"
    # One handshake per child link, each a real (positive, finite) duration.
    assert len(summary["handshake_ms"]) == len(SITES)
    assert all(ms > 0 and math.isfinite(ms) for ms in summary["handshake_ms"])


def test_explicit_insecure_plaintext_federation_still_works(sock_dir):
    topo = two_site_topology(sock_dir, "py-plain")
    summary, site_params = run_federation(topo, lambda node: {"insecure_plaintext": True})
    assert_trained_like_the_reference(topo, summary, site_params)
    assert summary["security_mode"] == "plaintext"
    assert summary["handshake_ms"] == []


# A plaintext site reads the root's refusal as it is. A secure site cannot
# trust a plain refusal (anyone on the path could send one): it tries again
# until its join timeout, whose error names the refusal.
@pytest.mark.parametrize("root_secure,error,message", [
    (True, fedwan.ProtocolError, r"refused by 'root': this node requires mutual TLS"),
    (False, fedwan.TimeoutError, r"encrypted link but this node runs with --insecure-plaintext"),
], ids=["plaintext-site-secure-root", "secure-site-plaintext-root"])
def test_mixed_security_modes_refuse_to_join(sock_dir, credentials, root_secure, error,
                                             message):
    topo = two_site_topology(sock_dir, "py-mixed")

    def security(node, secure):
        return {"credentials": credentials(topo, node)} if secure else {"insecure_plaintext": True}

    # Short timeouts: the refusal comes at once, the root then gives up soon.
    root = fedwan.Aggregator(topo, "root", np.zeros(8, np.float32), join_timeout_s=1.0,
                             **security("root", root_secure))
    worker = Worker("root", root.run)
    worker.start()
    core = fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), join_timeout_s=2.0,
                           **security("site-0", not root_secure))
    with pytest.raises(error, match=message):
        core.join()
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(worker.error, fedwan.TimeoutError)
    assert "did not join" in str(worker.error) and "site-0" in str(worker.error)
    del core, root


def read_audit_log(path, node):
    """The entries of a JSONL audit log, after checking its hash chain the
    way `fedwan audit verify` does."""
    entries, prev = [], "0" * 64
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == "", "the last entry ends with a newline"
    for seq, line in enumerate(lines[:-1]):
        entry = json.loads(line)
        assert list(entry) == ["seq", "time", "node", "event", "fields", "prev", "hash"]
        assert (entry["seq"], entry["node"], entry["prev"]) == (seq, node, prev)
        hashed = line[:line.rindex(',"hash":')]
        assert hashlib.sha256(hashed.encode()).hexdigest() == entry["hash"]
        prev = entry["hash"]
        entries.append(entry)
    return entries


def test_audit_log_records_handshakes_and_updates(sock_dir, credentials, tmp_path):
    topo = two_site_topology(sock_dir, "py-audit")
    logs = {node: tmp_path / f"{node}.audit.jsonl" for node in ("root",) + SITES}
    summary, site_params = run_federation(
        topo, lambda node: {"credentials": credentials(topo, node), "audit_log": logs[node]})
    assert_trained_like_the_reference(topo, summary, site_params)

    root = read_audit_log(logs["root"], "root")
    events = [e["event"] for e in root]
    assert "handshake" in events and "update" in events
    # A node with credentials opens its log with a signed head, then says
    # how its links are protected.
    assert root[0]["event"] == "audit_opened" and "sig" in root[0]["fields"]
    assert root[1]["event"] == "security_mode"
    assert root[1]["fields"]["mode"] == "mtls"
    handshakes = [e["fields"] for e in root if e["event"] == "handshake"]
    assert sorted(h["cert_node"] for h in handshakes) == sorted(SITES)
    assert all(h["decision"] == "accepted" and h["side"] == "child" for h in handshakes)

    # Every update accepted: in the first round, once its chunk closed (the
    # norm bound has no history yet, so the copies are held and judged
    # together: "held", then an "update_verdict").
    updates = [e["fields"] for e in root if e["event"] == "update"]
    assert all(u["decision"] in ("accepted", "held") for u in updates)
    held = [u for u in updates if u["decision"] == "held"]
    assert held and all(u["round"] == 0 for u in held)
    verdicts = [e["fields"] for e in root if e["event"] == "update_verdict"]
    assert sorted((v["sender"], v["chunk"]) for v in verdicts) == sorted(
        (u["sender"], u["chunk"]) for u in held)
    assert all(v["decision"] == "accepted" for v in verdicts)
    for node in SITES:
        site = read_audit_log(logs[node], node)
        site_events = {e["event"] for e in site}
        assert {"handshake", "update_sent"} <= site_events
        (handshake,) = [e["fields"] for e in site if e["event"] == "handshake"]
        assert (handshake["cert_node"], handshake["side"]) == ("root", "parent")
        sent = [e["fields"] for e in site if e["event"] == "update_sent"]
        assert [s["round"] for s in sent] == list(range(ROUNDS))
        # The root logged every chunk of every update this site sent.
        for s in sent:
            chunks = [u for u in updates if u["sender"] == node and u["round"] == s["round"]]
            assert sorted(u["chunk"] for u in chunks) == list(range(s["chunks"]))
            assert sum(u["bytes"] for u in chunks) == s["bytes"]


def test_residency_policy_is_visible_from_python():
    topo = fedwan.Topology.parse(
        """job: residency
policy: {k_min: 2}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, jurisdiction: EU, endpoint: "tcp://127.0.0.1:7001"}
  - {id: us, role: region, parent: root, jurisdiction: US, endpoint: "tcp://127.0.0.1:7002"}
  - {id: eu-a, role: site, parent: eu, allowed_jurisdictions: [EU]}
  - {id: eu-b, role: site, parent: eu}
  - {id: us-a, role: site, parent: us}
  - {id: us-b, role: site, parent: us}
"""
    )
    assert topo.node("eu").jurisdiction == "EU"
    assert topo.node("eu-a").allowed_jurisdictions == ["EU"]
    assert topo.k_min_for("eu") == 2
    assert topo.residency_refusal("eu-a", "eu") is None
    assert "may send its delta only to [EU]" in topo.residency_refusal("eu-a", "us")
