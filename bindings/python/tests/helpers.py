"""Helpers of the fedwan Python tests: topology text with ipc:// endpoints,
and threads that never outlive a test."""

import os
import threading
import time

# Every blocking call in these tests is bounded by these (seconds); a broken
# federation fails the test instead of hanging it.
JOIN_TIMEOUT_S = 10.0
ROUND_TIMEOUT_S = 10.0
THREAD_JOIN_S = 30.0


def topology_yaml(job, sock_dir, sites, *, rounds=3, inner_steps=2, codec="fp32",
                  chunk_bytes=4096, outer="fedavg", regions=None,
                  round_timeout_s=ROUND_TIMEOUT_S, overlap_steps=0):
    """Topology text with a root at `sock_dir`/root.sock. `sites` is a list of
    (id, parent, weight); `regions` a list of region ids under the root.
    `overlap_steps` > 0 makes the rounds overlapped (written only then)."""
    overlap = f"overlap_steps: {overlap_steps}, " if overlap_steps else ""
    lines = [
        f"job: {job}",
        f"federation: {{rounds: {rounds}, inner_steps: {inner_steps}, {overlap}codec: {codec}, "
        f"chunk_bytes: {chunk_bytes}, round_timeout_s: {round_timeout_s}, "
        f"outer_optimizer: {{name: {outer}}}}}",
        "nodes:",
        f'  - {{id: root, role: root, endpoint: "ipc://{os.path.join(sock_dir, "root.sock")}"}}',
    ]
    for region in regions or []:
        ep = os.path.join(sock_dir, f"{region}.sock")
        lines.append(f'  - {{id: {region}, role: region, parent: root, endpoint: "ipc://{ep}"}}')
    for node_id, parent, weight in sites:
        lines.append(f"  - {{id: {node_id}, role: site, parent: {parent}, weight: {weight}}}")
    return "\n".join(lines) + "\n"


class Worker(threading.Thread):
    """A daemon thread that records its target's result or exception."""

    def __init__(self, name, target):
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self._target_fn()
        except BaseException as e:  # noqa: B036 - reported by join_all
            self.error = e


def join_all(workers, timeout=THREAD_JOIN_S):
    """Joins every worker within `timeout` seconds and fails the test on a
    worker still running or one that raised."""
    for w in workers:
        w.join(timeout)
    stuck = [w.name for w in workers if w.is_alive()]
    assert not stuck, f"threads still running after {timeout} s: {stuck}"
    for w in workers:
        if w.error is not None:
            raise AssertionError(f"{w.name} failed: {w.error!r}") from w.error


def stop_while_running(name, call, stop, *, after_s=0.2, limit_s=2.0):
    """Runs `call` on a worker, calls `stop` `after_s` later and returns the
    exception `call` raised; fails unless it ended within `limit_s` of the
    stop. The sleep only makes "stop while blocked" the likely case: a stop
    that wins the race must end the call the same way."""
    worker = Worker(name, call)
    worker.start()
    time.sleep(after_s)
    started = time.monotonic()
    stop()
    worker.join(limit_s + 10)
    assert not worker.is_alive(), f"{name} still blocked {limit_s + 10} s after stop()"
    elapsed = time.monotonic() - started
    assert elapsed < limit_s, f"{name} ended {elapsed:.1f} s after stop()"
    error, worker.error = worker.error, None
    return error
