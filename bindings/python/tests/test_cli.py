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
