"""Runs fedwan-linkemu (benchmarks/wan/linkemu) over a set of namespaces."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from typing import Optional


class LinkEmulator:
    """Starts the emulator with `config` (its JSON format, docs/benchmarks.md)
    and waits until every TUN device is up. stop() ends it and returns its
    per-link statistics; so does leaving a `with` block."""

    method = "fedwan-linkemu (userspace TUN emulator)"

    def __init__(self, binary: str, config: dict, workdir: str, timeout: float = 20.0):
        self.config_path = os.path.join(workdir, "linkemu.json")
        self.stats_path = os.path.join(workdir, "linkemu-stats.json")
        self.log_path = os.path.join(workdir, "linkemu.log")
        with open(self.config_path, "w") as f:
            json.dump(config, f, indent=2)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "--config", self.config_path, "--stats", self.stats_path],
            stdout=subprocess.PIPE, stderr=self._log, text=True)
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline().strip()
                break
            if self.proc.poll() is not None:
                break
        if line != "ready":
            self.proc.kill()
            self.proc.wait()
            self._log.close()
            raise RuntimeError(f"fedwan-linkemu did not start: {open(self.log_path).read().strip()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the emulator has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tick

    def snapshot(self, timeout: float = 5.0) -> dict:
        """Statistics so far (SIGUSR1), the emulator running on."""
        before = os.stat(self.stats_path).st_mtime_ns if os.path.exists(self.stats_path) else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.stats_path) and os.stat(self.stats_path).st_mtime_ns != before:
                with open(self.stats_path) as f:
                    return json.load(f)
            time.sleep(0.02)
        raise RuntimeError("fedwan-linkemu wrote no statistics")

    def stop(self) -> Optional[dict]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if not os.path.exists(self.stats_path):
            return None
        with open(self.stats_path) as f:
            return json.load(f)

    def __enter__(self) -> "LinkEmulator":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
