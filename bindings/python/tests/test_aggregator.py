"""fedwan.Aggregator from Python: option errors, stop(), timeouts, and
callback exceptions that propagate out of run() without hanging anything."""

import _thread
import builtins
import threading
import time

import numpy as np
import pytest

import fedwan
from helpers import JOIN_TIMEOUT_S, Worker, join_all, stop_while_running, topology_yaml


def two_site_topology(sock_dir, **kw):
    return fedwan.Topology.parse(topology_yaml(
        "py-agg", sock_dir, [("site-0", "root", 1), ("site-1", "root", 1)], **kw))


def synthetic_site(topo, node_id, initial, credentials):
    """A site on the synthetic workload. Returns None when the federation
    finished, else the name of the fedwan error that ended it (not the error
    itself: its traceback would keep the SiteCore and its socket alive)."""
    params = initial.copy()
    core = fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                           credentials=credentials)
    try:
        core.join()
        while not core.finished:
            fedwan.synthetic_local_steps(params, topo.node(node_id).index, 2, 5)
            core.sync()
    except fedwan.Error as e:
        return type(e).__name__
    return None


def test_options_are_checked(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    creds = credentials(topo, "root")
    with pytest.raises(fedwan.ConfigError, match="root 'root' needs an initial model"):
        fedwan.Aggregator(topo, "root", credentials=creds)
    with pytest.raises(fedwan.ConfigError, match="'site-0' is a site"):
        fedwan.Aggregator(topo, "site-0", credentials=credentials(topo, "site-0"))
    with pytest.raises(fedwan.ConfigError, match="initial_model must have dtype float32"):
        fedwan.Aggregator(topo, "root", np.zeros(4), credentials=creds)
    with pytest.raises(fedwan.ConfigError, match="on_round must be callable"):
        fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), on_round=3, credentials=creds)
    with pytest.raises(fedwan.ConfigError, match="spill_from_bytes must be >= 0"):
        fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), spill_from_bytes=-1,
                          credentials=creds)
    with pytest.raises(fedwan.ConfigError, match="replica_max_bytes must be > 0"):
        fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), replica_max_bytes=0,
                          credentials=creds)


def test_a_root_that_keeps_its_round_on_disk_gives_the_same_model(sock_dir, credentials,
                                                                   tmp_path):
    # spill_from_bytes=0: every anchor frame and every chunk waiting for
    # copies goes through the unnamed file in checkpoint_dir, and back.
    # With and without pacing the sites (pace_uploads) alike.
    models = []
    for spill, paced in ((None, True), (0, True), (0, False)):
        topo = two_site_topology(sock_dir, rounds=3)
        initial = fedwan.synthetic_initial_model(300, 5)
        root = fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                                 credentials=credentials(topo, "root"),
                                 checkpoint_dir=tmp_path / f"spill-{spill}-{paced}",
                                 spill_from_bytes=spill, pace_uploads=paced)
        sites = [Worker(n, lambda n=n: synthetic_site(topo, n, initial, credentials(topo, n)))
                 for n in ("site-0", "site-1")]
        for w in sites:
            w.start()
        summary = root.run()
        root.close()
        join_all(sites)
        assert [w.result for w in sites] == [None, None]
        assert summary["chunks_parked"] >= 0 and summary["parked_bytes"] >= 0
        if spill is None:
            assert summary["chunks_parked"] == 0  # a small model keeps its round in memory
        models.append(summary["global_model"])
    assert np.array_equal(models[0], models[1])
    assert np.array_equal(models[0], models[2])


def test_join_timeout_names_the_missing_children(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    root = fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=0.3,
                             credentials=credentials(topo, "root"))
    with pytest.raises(fedwan.TimeoutError, match="did not join.*site-0, site-1") as info:
        root.run()
    assert isinstance(info.value, builtins.TimeoutError)
    with pytest.raises(fedwan.Error, match="already called"):
        root.run()


def test_stop_from_another_thread_ends_run(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    root = fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=60,
                             credentials=credentials(topo, "root"))
    error = stop_while_running("root", root.run, root.stop)
    assert isinstance(error, fedwan.StoppedError) and "stopped" in str(error)
    assert isinstance(error, fedwan.Error)


def test_ctrl_c_stops_run_within_a_second(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    root = fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=60,
                             credentials=credentials(topo, "root"))
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        root.run()
    assert time.monotonic() - started < 2.5
    timer.join()


# on_model fails in round 1 of 3: the federation is cut short and the sites
# time out. on_round fails after the last round: the sites are already done.
@pytest.mark.parametrize("which,failing_call,sites_finish",
                         [("on_model", 2, False), ("on_round", 3, True)])
def test_callback_exception_propagates_out_of_run(sock_dir, credentials, which, failing_call,
                                                  sites_finish):
    # A short round timeout: the sites give up soon after the root is gone.
    topo = two_site_topology(sock_dir, rounds=3, round_timeout_s=1.0)
    initial = fedwan.synthetic_initial_model(64, 5)
    calls = []

    def callback(*args):
        calls.append(threading.current_thread().name)
        if len(calls) == failing_call:
            raise ValueError(f"boom from {which}")

    root = fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                             credentials=credentials(topo, "root"), **{which: callback})
    sites = [Worker(n, lambda n=n: synthetic_site(topo, n, initial, credentials(topo, n)))
             for n in ("site-0", "site-1")]
    for w in sites:
        w.start()
    with pytest.raises(ValueError, match=f"boom from {which}"):
        root.run()
    # Callbacks ran on run()'s thread (this one) until one raised; no more.
    assert calls == [threading.current_thread().name] * failing_call
    del root  # closes its sockets
    join_all(sites)
    want = None if sites_finish else "TimeoutError"
    assert [w.result for w in sites] == [want, want]


def test_a_with_block_closes_the_aggregator_and_frees_its_endpoint(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    creds = credentials(topo, "root")
    with fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=0.2,
                           credentials=creds) as root:
        assert not root.closed
        with pytest.raises(fedwan.TimeoutError):
            root.run()
    assert root.closed
    root.close()  # idempotent
    root.stop()   # nothing left to stop
    with pytest.raises(fedwan.Error, match="after close"):
        root.run()
    # The endpoint is free again: the same node binds it at once.
    with fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=0.2,
                           credentials=creds) as again:
        assert not again.closed


def test_an_exception_in_the_block_propagates_after_closing(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    with pytest.raises(ValueError, match="from the block"):
        with fedwan.Aggregator(topo, "root", np.zeros(4, np.float32),
                               credentials=credentials(topo, "root")) as root:
            raise ValueError("from the block")
    assert root.closed


def test_close_from_another_thread_stops_a_running_aggregator(sock_dir, credentials):
    topo = two_site_topology(sock_dir)
    root = fedwan.Aggregator(topo, "root", np.zeros(4, np.float32), join_timeout_s=60,
                             credentials=credentials(topo, "root"))
    error = stop_while_running("root", root.run, root.close)
    # close() stops a run in progress; one that closed before run() began
    # leaves nothing to run.
    assert isinstance(error, fedwan.StoppedError) or "after close" in str(error)
    assert root.closed


def test_close_from_a_callback_of_its_own_run_is_refused(sock_dir, credentials):
    # Refused at the last round's report, so the sites are done already.
    topo = two_site_topology(sock_dir, rounds=3, round_timeout_s=1.0)
    initial = fedwan.synthetic_initial_model(64, 5)
    holder = {"reports": 0}

    def on_round(report):
        holder["reports"] += 1
        if holder["reports"] == 3:
            holder["agg"].close()

    root = fedwan.Aggregator(topo, "root", initial, on_round=on_round,
                             join_timeout_s=JOIN_TIMEOUT_S, credentials=credentials(topo, "root"))
    holder["agg"] = root
    sites = [Worker(n, lambda n=n: synthetic_site(topo, n, initial, credentials(topo, n)))
             for n in ("site-0", "site-1")]
    for w in sites:
        w.start()
    with pytest.raises(fedwan.Error, match="from a callback of its own run"):
        root.run()
    assert not root.closed
    root.close()
    assert root.closed
    join_all(sites)
    assert [w.result for w in sites] == [None, None]
