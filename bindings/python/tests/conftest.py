"""Fixtures of the fedwan Python tests: short socket directories and
provisioned credentials."""

import shutil
import signal
import tempfile
import threading

import pytest

import fedwan

# Some tests press Ctrl-C (SIGINT) on themselves. A suite started from a
# non-interactive shell in the background inherits SIGINT ignored, and Python
# then leaves it ignored: restore Python's own handler so they test fedwan,
# not how the suite was launched.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def sock_dir(tmp_path):
    """A directory for ipc:// sockets. Unix socket paths are limited to about
    100 bytes, so a long pytest tmp_path falls back to a short temporary one."""
    if len(str(tmp_path)) <= 70:
        yield str(tmp_path)
        return
    short = tempfile.mkdtemp(prefix="fw")
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)



@pytest.fixture
def credentials(tmp_path):
    """``credentials(topology, node_id)`` -> the node's bundle directory.

    The first call for a topology provisions it with
    fedwan.provision_credentials into tmp_path: one federation CA per
    topology, as one federation has, shared by every node of the test.
    Callable from node threads."""
    provisioned = {}
    lock = threading.Lock()

    def bundle(topology, node_id):
        key = topology.digest_hex()
        with lock:
            if key not in provisioned:
                directory = tmp_path / f"pki-{len(provisioned)}"
                fedwan.provision_credentials(topology, directory)
                provisioned[key] = directory
        return fedwan.credentials_path(provisioned[key], node_id)

    return bundle
