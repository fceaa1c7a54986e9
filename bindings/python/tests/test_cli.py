"""``python -m fedwan``: forwards to the ``fedwan`` command-line tool."""

import os
import subprocess
import sys

import pytest

import fedwan


def run_module(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fedwan", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.skipif(not os.environ.get("FEDWAN_CLI"),
                    reason="FEDWAN_CLI names no fedwan tool (a build without LibTorch)")
def test_python_m_fedwan_runs_the_tool_with_its_arguments():
    r = run_module("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("0."), r.stdout
    r = run_module("demo", "--no-such-flag")
    assert r.returncode != 0
    assert "--no-such-flag" in r.stderr


def test_python_m_fedwan_without_the_tool_says_how_to_get_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FEDWAN_CLI"}
    env["PATH"] = str(tmp_path)  # no fedwan on it
    r = run_module("--version", env=env)
    assert r.returncode != 0
    assert "command-line tool is not on PATH" in r.stderr
    env["FEDWAN_CLI"] = str(tmp_path / "missing")
    r = run_module("--version", env=env)
    assert r.returncode != 0
    assert "is not an executable file" in r.stderr
    assert fedwan.__name__ == "fedwan"


@pytest.mark.skipif(not os.environ.get("FEDWAN_CLI"),
                    reason="FEDWAN_CLI names no fedwan tool (a build without LibTorch)")
def test_aggregator_initial_model_is_checked(tmp_path):
    import numpy as np
    topo = tmp_path / "federation.yaml"
    topo.write_text(
        "job: initial-model\n"
        "federation: {rounds: 1, inner_steps: 1, codec: fp32}\n"
        "nodes:\n"
        '  - {id: root, role: root, endpoint: "tcp://127.0.0.1:1"}\n'
        '  - {id: region, role: region, parent: root, endpoint: "tcp://127.0.0.1:2"}\n'
        "  - {id: s, role: site, parent: region, weight: 1}\n")

    def aggregator(node, model_file, *extra):
        return subprocess.run(
            [os.environ["FEDWAN_CLI"], "aggregator", "--topology", str(topo), "--node", node,
             "--insecure-plaintext", "--join-timeout", "0.5", "--initial-model",
             str(model_file), *extra], capture_output=True, text=True, timeout=60)

    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 6)
    r = aggregator("root", odd)
    assert r.returncode != 0 and "holds 6 bytes" in r.stderr and "fp32" in r.stderr
    nan = tmp_path / "nan.bin"
    np.array([1.0, np.nan], dtype=np.float32).tofile(nan)
    r = aggregator("root", nan)
    assert r.returncode != 0 and "value 1 is not finite" in r.stderr
    r = aggregator("root", tmp_path / "missing.bin")
    assert r.returncode != 0 and "missing.bin" in r.stderr
    good = tmp_path / "good.bin"
    np.ones(4, dtype=np.float32).tofile(good)
    # A region takes the initial model too (it then joins without being sent
    # it); its file is checked the same way.
    r = aggregator("region", odd)
    assert r.returncode != 0 and "holds 6 bytes" in r.stderr
    r = aggregator("region", good)
    assert r.returncode != 0 and "did not join" in r.stderr and "configuration" not in r.stderr
    r = aggregator("root", good, "--eval")
    assert r.returncode != 0 and "--eval" in r.stderr
