"""Network namespaces for the harness: create and delete them, run programs in
them, and open sockets in them from this process.

Everything needs root (CAP_NET_ADMIN). `unavailable_reason()` says why a
machine cannot run the harness, so callers can skip instead of failing.
Namespaces are named "fwb-<run>-<node>"; `Namespace` deletes its own on
exit, and `sweep(run)` removes what a killed run left behind.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import threading
from typing import Callable, Optional, Sequence

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_setns_lock = threading.Lock()


def ip_tool() -> Optional[str]:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None
    )


def unavailable_reason(tun: bool = True) -> Optional[str]:
    """None when this process can create namespaces and (with `tun`, as the
    link emulator needs) TUN devices."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces and TUN devices"
    if ip_tool() is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    if tun and not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "no /dev/net/tun"
    name = f"fwb-probe-{os.getpid()}"
    r = subprocess.run([ip_tool(), "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot create a network namespace: " + r.stderr.strip()
    subprocess.run([ip_tool(), "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> str:
    r = subprocess.run([ip_tool(), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class Namespace:
    """One named network namespace, deleted by close() (processes still
    running in it keep it alive until they exit)."""

    def __init__(self, name: str):
        if len(name) > 200 or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"bad namespace name {name!r}")
        self.name = name
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.name}"

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`ip netns exec NAME argv...`: execs argv in place, so the pid a
        Popen gets is the program's own (signals and rusage reach it)."""
        return [ip_tool(), "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv), **kwargs)

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), **kwargs)

    def inside(self, make: Callable[[], socket.socket]) -> socket.socket:
        """Calls make() with this thread in the namespace: a socket it
        creates belongs to the namespace for good, whichever thread uses it."""
        with _setns_lock:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            target = os.open(self.path, os.O_RDONLY)
            try:
                if _libc.setns(target, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {self.name}")
                try:
                    return make()
                finally:
                    _libc.setns(home, CLONE_NEWNET)
            finally:
                os.close(target)
                os.close(home)

    def close(self) -> None:
        subprocess.run([ip_tool(), "netns", "del", self.name], capture_output=True)

    def __enter__(self) -> "Namespace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sweep(prefix: str = "fwb-") -> list[str]:
    """Deletes every namespace whose name starts with `prefix` (what runs that
    were killed left behind). Returns their names."""
    out = subprocess.run([ip_tool(), "netns", "list"], capture_output=True, text=True).stdout
    gone = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            subprocess.run([ip_tool(), "netns", "del", name], capture_output=True)
            gone.append(name)
    return gone
