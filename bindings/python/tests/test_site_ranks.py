"""A site of two ranks under torch.distributed (gloo on CPU processes, DDP
inside the site): rank 0 talks to the federation, the other rank receives
every model over the site's process group. Both ranks end holding the
federation's model; a failure of the leader reaches the other rank as an
error, not a hang."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fedwan
from helpers import JOIN_TIMEOUT_S, Worker, join_all, topology_yaml

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "site_rank_worker.py")


def start_ranks(topo_path, node_id, creds, out_dir, join_timeout_s):
    env = dict(os.environ, WORLD_SIZE="2", OMP_NUM_THREADS="1")
    # The workers import the same fedwan as this test.
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(fedwan.__file__))] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return [subprocess.Popen(
        [sys.executable, WORKER, str(topo_path), node_id, str(creds), str(out_dir),
         str(join_timeout_s)], env=dict(env, RANK=str(r)), stderr=subprocess.PIPE, text=True)
        for r in range(2)]


def wait_all(procs, timeout=120):
    """Waits for the ranks; fails with their stderr (a hung rank's stacks)
    when one did not exit cleanly."""
    errors = []
    try:
        for rank, p in enumerate(procs):
            _, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                errors.append(f"rank {rank} exited with {p.returncode}:\n{err}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not errors, "\n".join(errors)


def initial_model():
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()


@pytest.mark.parametrize("overlap_steps", [0, 2], ids=["blocking", "overlapped"])
def test_two_rank_site_ends_with_the_federation_model(tmp_path, sock_dir, credentials,
                                                      overlap_steps):
    # Overlapped, the ranks merge the leader's model at the same step (one
    # result per round still, the last round's at its update).
    text = topology_yaml(f"py-ranks-{overlap_steps}", sock_dir,
                         [("site-ddp", "root", 2), ("site-1", "root", 1)],
                         rounds=3, inner_steps=3, overlap_steps=overlap_steps)
    topo_path = tmp_path / "federation.yaml"
    topo_path.write_text(text)
    topo = fedwan.Topology.load(topo_path)
    initial = initial_model()

    root = Worker("root", lambda: fedwan.Aggregator(
        topo, "root", initial_model=initial, join_timeout_s=60,
        credentials=credentials(topo, "root")).run())
    root.start()

    def single_site():
        params = initial.copy() + 0.5
        with fedwan.SiteCore(topo, "site-1", params, join_timeout_s=60,
                             credentials=credentials(topo, "site-1")) as core:
            r = core.join()
            while not r["finished"]:
                params -= 0.01 * params
                r = core.sync()
        return params.copy()

    other = Worker("site-1", single_site)
    other.start()
    procs = start_ranks(topo_path, "site-ddp", credentials(topo, "site-ddp"), tmp_path, 60)
    wait_all(procs)
    join_all([root, other], timeout=60)
    errors = [(tmp_path / f"rank{r}.error") for r in range(2)]
    assert not any(e.exists() for e in errors), [e.read_text() for e in errors if e.exists()]
    assert [p.returncode for p in procs] == [0, 0]

    final = np.asarray(root.result["global_model"])
    assert not np.array_equal(final, initial)
    for r in range(2):
        held = np.load(tmp_path / f"rank{r}.npy")
        assert np.array_equal(held, final), f"rank {r} does not hold the federation's model"
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert report == {"steps": 9, "syncs": 3, "round": 3, "leader": r == 0}
    assert np.array_equal(other.result, final)


def test_a_failing_leader_fails_the_other_rank_with_its_message(tmp_path, sock_dir, credentials):
    # No root is running: the leader's join times out, and rank 1, waiting
    # for the model in a broadcast, raises naming the leader's error.
    text = topology_yaml("py-ranks-fail", sock_dir, [("site-ddp", "root", 1)])
    topo_path = tmp_path / "federation.yaml"
    topo_path.write_text(text)
    topo = fedwan.Topology.load(topo_path)
    procs = start_ranks(topo_path, "site-ddp", credentials(topo, "site-ddp"), tmp_path, 1.0)
    wait_all(procs, timeout=60)
    leader = (tmp_path / "rank0.error").read_text()
    other = (tmp_path / "rank1.error").read_text()
    assert leader.startswith("TimeoutError: ") and "is the parent running" in leader
    assert other.startswith("Error: Site.join(): the site's leader")
    assert other.endswith(leader), "rank 1 repeats the leader's error"
