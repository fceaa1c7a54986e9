"""What the harness needs of the machine it runs on: its tools and a
description of it for the results."""

from __future__ import annotations

import os
import platform
import shutil
import sys

SKIP = 77  # cannot run on this machine (no root, namespaces or TUN)


def find_tool(name: str, given: str | None) -> str:
    """`given`, else `name` in $FEDWAN_BIN_DIR, beside the running program or
    on the PATH."""
    if given:
        return given
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    for d in (os.environ.get("FEDWAN_BIN_DIR", ""), here):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"fedwan bench: cannot find '{name}' (set FEDWAN_BIN_DIR or --{name.split('-')[-1]})")
    return found


def machine() -> dict:
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            cc = f.read().strip()
    except OSError:
        cc = "unknown"
    return {"cores": len(os.sched_getaffinity(0)), "kernel": platform.release(), "tcp_cc": cc,
            "python": platform.python_version()}
