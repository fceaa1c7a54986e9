"""Checkpoints from Python: a federation with checkpoint_dir writes one per
node at every round boundary (the latest and the one before), and
SiteCore.service() keeps the link alive between syncs without disturbing
training. Crash and resume are covered by the C++ chaos suite."""

import json
import os

import numpy as np
import pytest

import fedwan
from helpers import JOIN_TIMEOUT_S, ROUND_TIMEOUT_S, Worker, join_all, topology_yaml


def test_checkpoints_are_written_at_round_boundaries(sock_dir, credentials,
                                                                  tmp_path):
    topo = fedwan.Topology.parse(topology_yaml(
        "py-recovery", sock_dir, [("site-0", "root", 1), ("site-1", "root", 3)], rounds=3))
    ckpt = {n: str(tmp_path / "ckpt" / n) for n in ("root", "site-0", "site-1")}
    init = np.linspace(-1, 1, 2000, dtype=np.float32)
    root = fedwan.Aggregator(topo, "root", init, join_timeout_s=JOIN_TIMEOUT_S,
                             round_timeout_s=ROUND_TIMEOUT_S,
                             credentials=credentials(topo, "root"), checkpoint_dir=ckpt["root"])
    finals = {}

    def site(node_id, target):
        params = init.copy()
        core = fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                               round_timeout_s=ROUND_TIMEOUT_S,
                               credentials=credentials(topo, node_id),
                               checkpoint_dir=ckpt[node_id])
        result = core.join()
        while not result["finished"]:
            for _ in range(core.inner_steps):
                params -= np.float32(0.5) * (params - np.float32(target))
                assert not core.service()["resynced"]
            result = core.sync()
        finals[node_id] = params.copy()

    workers = [Worker("root", root.run), Worker("site-0", lambda: site("site-0", 1.0)),
               Worker("site-1", lambda: site("site-1", -1.0))]
    for w in workers:
        w.start()
    join_all(workers)
    for node_id, d in ckpt.items():
        assert os.path.exists(os.path.join(d, f"{node_id}.fwck")), node_id
        assert os.path.exists(os.path.join(d, f"{node_id}.prev.fwck")), node_id

    np.testing.assert_array_equal(finals["site-0"], finals["site-1"])
    # The root keeps each site's checkpoint as a replica (2 rounds at most).
    for node_id in ("site-0", "site-1"):
        replicas = sorted(os.listdir(os.path.join(ckpt["root"], "replicas", node_id)))
        assert replicas, node_id
        assert len(replicas) <= 2, replicas
        assert all(r.startswith("round-") and r.endswith(".fwck") for r in replicas), replicas


def test_standby_options_are_checked(sock_dir, credentials, tmp_path):
    topo = fedwan.Topology.parse(topology_yaml(
        "py-standby", sock_dir, [("site-0", "root", 1)], rounds=1))
    init = np.zeros(100, dtype=np.float32)
    # The topology names no standby_endpoint for its root.
    try:
        fedwan.Aggregator(topo, "root", init, credentials=credentials(topo, "root"),
                          checkpoint_dir=str(tmp_path / "standby"), standby=True)
    except fedwan.ConfigError as e:
        assert "standby_endpoint" in str(e)
    else:
        raise AssertionError("a standby without standby_endpoint was accepted")


def test_a_restart_on_a_truncated_audit_log_raises_an_alarm(sock_dir, credentials, tmp_path):
    """A site's checkpoint records its audit log's head; a site resumed on a
    log cut back behind that head says so in SiteCore.alarms and in the log."""
    topo = fedwan.Topology.parse(topology_yaml(
        "py-alarm", sock_dir, [("site-0", "root", 1), ("site-1", "root", 1)], rounds=2))
    init = np.linspace(-1, 1, 2000, dtype=np.float32)
    ckpt = {n: str(tmp_path / n) for n in ("root", "site-0", "site-1")}
    audit = str(tmp_path / "site-0.audit")
    root = fedwan.Aggregator(topo, "root", init, join_timeout_s=JOIN_TIMEOUT_S,
                             round_timeout_s=ROUND_TIMEOUT_S,
                             credentials=credentials(topo, "root"), checkpoint_dir=ckpt["root"])

    def site(node_id):
        params = init.copy()
        extra = {"audit_log": audit} if node_id == "site-0" else {}
        core = fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                               round_timeout_s=ROUND_TIMEOUT_S,
                               credentials=credentials(topo, node_id),
                               checkpoint_dir=ckpt[node_id], **extra)
        result = core.join()
        while not result["finished"]:
            params *= np.float32(0.9)
            result = core.sync()
        assert core.alarms == []

    workers = [Worker("root", root.run), Worker("site-0", lambda: site("site-0")),
               Worker("site-1", lambda: site("site-1"))]
    for w in workers:
        w.start()
    join_all(workers)

    with open(audit) as f:
        lines = f.readlines()
    last_checkpoint = max(i for i, l in enumerate(lines) if json.loads(l)["event"] == "checkpoint")
    assert last_checkpoint > 2
    with open(audit, "w") as f:
        f.writelines(lines[:last_checkpoint - 1])

    params = init.copy()
    core = fedwan.SiteCore(topo, "site-0", params, join_timeout_s=0.5, round_timeout_s=0.5,
                           credentials=credentials(topo, "site-0"),
                           checkpoint_dir=ckpt["site-0"], audit_log=audit)
    with pytest.raises(fedwan.TimeoutError):  # resumes, then finds no parent
        core.join()
    assert any(a.startswith("audit_truncated") for a in core.alarms), core.alarms
    with open(audit) as f:
        assert any(json.loads(l)["event"] == "audit_truncated" for l in f)
