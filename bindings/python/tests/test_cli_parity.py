"""A federation of Python sites under C++ aggregators ends with the same
parameters, bit for bit (fp32 codec), as the same federation of C++ sites
(`fedwan site`) for the same seed: the Python layer adds no arithmetic of
its own. The aggregators are the command-line tool's in both runs."""

import os
import subprocess

import numpy as np
import pytest

import fedwan
from helpers import Worker, join_all, topology_yaml

torch = pytest.importorskip("torch")
CLI = os.environ.get("FEDWAN_CLI")
pytestmark = pytest.mark.skipif(
    not CLI, reason="FEDWAN_CLI names no fedwan tool (a build without LibTorch)")

N, SEED, ROUNDS, INNER = 3000, 11, 3, 2
SITES = [("site-a", "region", 2), ("site-b", "region", 1), ("site-c", "root", 1)]


def workload():
    return ["--trainer", "synthetic", "--synthetic-size", str(N), "--seed", str(SEED)]


def node(cmd, topo_path, node_id, bundle, out, join_timeout="30"):
    return subprocess.Popen(
        [CLI, cmd, "--topology", str(topo_path), "--node", node_id, "--credentials", bundle,
         "--join-timeout", join_timeout, "--out", str(out)] + workload(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs, timeout=120):
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out


def federation(tmp_path, sock_dir, name, credentials):
    d = tmp_path / name
    d.mkdir()
    socks = os.path.join(sock_dir, name)
    os.makedirs(socks, exist_ok=True)
    text = topology_yaml(f"parity-{name}", socks, SITES, rounds=ROUNDS, inner_steps=INNER,
                         codec="fp32", regions=["region"])
    topo_path = d / "federation.yaml"
    topo_path.write_text(text)
    topo = fedwan.Topology.load(topo_path)
    aggs = [node("aggregator", topo_path, n, credentials(topo, n), d / f"{n}.bin")
            for n in ("root", "region")]
    return d, topo_path, topo, aggs


def python_site(topo, node_id, bundle):
    """The CLI's synthetic site loop, from Python: one local step, then
    Site.step() (service, and every H-th call sync)."""
    param = torch.zeros(N)  # join loads the federation's model
    index = topo.node(node_id).index
    with fedwan.Site([param], topology=topo, node_id=node_id, join_timeout_s=30,
                     credentials=bundle) as site:
        while not site.finished:
            fedwan.synthetic_local_steps(site.flat.numpy(), index, 1, SEED)
            site.step()
    return param.numpy().copy()


def test_python_sites_match_cpp_sites_bit_for_bit(tmp_path, sock_dir, credentials):
    # C++ sites.
    d, topo_path, topo, aggs = federation(tmp_path, sock_dir, "cpp", credentials)
    sites = [node("site", topo_path, n, credentials(topo, n), d / f"{n}.bin")
             for n, _, _ in SITES]
    finish(aggs + sites)
    cpp_root = np.fromfile(d / "root.bin", dtype=np.float32)
    cpp_sites = {n: np.fromfile(d / f"{n}.bin", dtype=np.float32) for n, _, _ in SITES}

    # Python sites, the same aggregators.
    d, topo_path, topo, aggs = federation(tmp_path, sock_dir, "py", credentials)
    workers = [Worker(n, lambda n=n: python_site(topo, n, credentials(topo, n)))
               for n, _, _ in SITES]
    for w in workers:
        w.start()
    try:
        join_all(workers, timeout=120)
    finally:
        finish(aggs)
    py_root = np.fromfile(d / "root.bin", dtype=np.float32)

    assert cpp_root.shape == (N,)
    initial = fedwan.synthetic_initial_model(N, SEED)
    assert not np.array_equal(cpp_root, initial), "the federation trained"
    assert np.array_equal(py_root, cpp_root), \
        f"max |diff| {np.max(np.abs(py_root - cpp_root))}"
    for w in workers:
        assert np.array_equal(w.result, cpp_sites[w.name]), w.name
        assert np.array_equal(w.result, cpp_root), w.name
