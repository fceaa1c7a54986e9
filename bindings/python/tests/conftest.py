"""Fixtures of the fedwan Python tests."""

import shutil
import tempfile

import pytest


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

