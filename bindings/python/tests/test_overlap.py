"""Overlapped rounds (federation.overlap_steps = tau): SiteCore.begin_sync()/
finish_sync() and fedwan.Site.step() keep training while the update goes up
and the next model comes down, and merge it tau steps later. Federations of
threads checked against a NumPy reference of the schedule, against the
blocking federation, and the calls a pending sync refuses."""

import _thread
import threading
import time

import numpy as np
import pytest

import fedwan
import fedwan.site
from helpers import (JOIN_TIMEOUT_S, ROUND_TIMEOUT_S, Worker, join_all, stop_while_running,
                     topology_yaml)

torch = pytest.importorskip("torch")

SEED = 11
# Local learning rates of the synthetic sites. They differ: with one rate,
# FedAvg (lr 1) over these affine steps averages the merge corrections away
# and the overlapped federation would end on the blocking one's model.
SITE_LR = {"a": 0.05, "b": 0.2, "site-0": 0.05}


def reference(initial, steps, weights, rounds, inner_steps, overlap_steps):
    """The root's final model under FedAvg (lr 1) in fp32. `steps[i](x, k)`
    returns site i's params after k local steps from x. Blocking (tau 0):
    every round starts from the global model. Overlapped: a site sends its
    params after H steps, trains tau more, then merges the new global model:
    params += new - sent; the next update goes H steps after the last one;
    the last round's merge takes the final model."""
    f32 = np.float32
    global_model = initial.copy()
    held = [initial.copy() for _ in steps]
    done = 0
    for r in range(rounds):
        sent = [step(x, inner_steps - done) for step, x in zip(steps, held)]
        acc = np.zeros_like(initial)
        for x, w in zip(sent, weights):
            acc = acc + f32(w) * (global_model - x)
        new = global_model - acc / f32(sum(weights))
        last = r + 1 == rounds
        done = 0 if last else overlap_steps
        held = [new.copy() if overlap_steps == 0 or last else step(x, done) + (new - x)
                for step, x in zip(steps, sent)]
        global_model = new
    return global_model


def synthetic_step(index, lr):
    def step(x, k):
        x = x.copy()
        if k:
            fedwan.synthetic_local_steps(x, index, k, SEED, lr)
        return x
    return step


def run_root(topo, initial, credentials):
    return fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                             round_timeout_s=ROUND_TIMEOUT_S,
                             credentials=credentials(topo, "root")).run()


def core_site(topo, node_id, initial, credentials, poll=False):
    """A SiteCore driven as the C++ sites drive one: H steps, begin_sync(),
    tau steps (none in the last round), finish_sync() (with `poll`:
    wait_sync() in short slices until it merges); sync() when tau is 0."""
    index, lr = topo.node(node_id).index, SITE_LR[node_id]
    params = initial.copy()
    results = []
    with fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                         round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, node_id)) as core:
        core.join()
        done = 0
        while not core.finished:
            fedwan.synthetic_local_steps(params, index, core.inner_steps - done, SEED, lr)
            if core.overlap_steps == 0:
                results.append(core.sync())
                continue
            ending = core.round
            core.begin_sync()
            assert core.sync_pending and core.round == ending and not core.finished
            done = core.overlap_steps if core.round + 1 < core.rounds else 0
            if done:
                fedwan.synthetic_local_steps(params, index, done, SEED, lr)
            if poll:
                got = core.wait_sync(0.005)
                while got is None:
                    assert core.sync_pending
                    got = core.wait_sync(0.005)
                results.append(got)
            else:
                results.append(core.finish_sync())
            assert not core.sync_pending
            if results[-1]["resynced"]:
                done = 0
    return params, results


def test_overlapped_site_cores_match_the_reference_and_differ_from_blocking(
        sock_dir, credentials):
    rounds, inner_steps, tau, n = 4, 4, 2, 3000
    sites = [("a", "root", 3), ("b", "root", 1)]
    initial = fedwan.synthetic_initial_model(n, SEED)
    finals = {}
    for overlap in (tau, 0):
        topo = fedwan.Topology.parse(topology_yaml(
            f"py-overlap-{overlap}", sock_dir, sites, rounds=rounds, inner_steps=inner_steps,
            overlap_steps=overlap))
        assert topo.overlap_steps == overlap
        workers = [Worker("root", lambda: run_root(topo, initial, credentials))] + [
            Worker(s, lambda s=s: core_site(topo, s, initial, credentials, poll=s == "b"))
            for s, _, _ in sites]
        for w in workers:
            w.start()
        join_all(workers)
        got = workers[0].result["global_model"]
        steps = [synthetic_step(topo.node(s).index, SITE_LR[s]) for s, _, _ in sites]
        want = reference(initial, steps, [w for _, _, w in sites], rounds, inner_steps, overlap)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        for w in workers[1:]:
            params, results = w.result
            assert np.array_equal(params, got), f"{w.name} does not hold the final model"
            assert [r["round"] for r in results] == list(range(1, rounds + 1))
            assert results[-1]["finished"] and not any(r["finished"] for r in results[:-1])
            assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in results)
        finals[overlap] = got
    # The progress made while the update was in flight is kept: another model.
    assert np.abs(finals[tau] - finals[0]).max() > 1e-3


def test_a_pending_sync_refuses_what_it_cannot_do(sock_dir, credentials):
    topo = fedwan.Topology.parse(topology_yaml(
        "py-overlap-misuse", sock_dir, [("site-0", "root", 1)], rounds=1, inner_steps=2,
        overlap_steps=1))
    initial = fedwan.synthetic_initial_model(64, SEED)
    root = Worker("root", lambda: run_root(topo, initial, credentials))
    root.start()
    params = initial.copy()
    with fedwan.SiteCore(topo, "site-0", params, join_timeout_s=JOIN_TIMEOUT_S,
                         round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, "site-0")) as core:
        assert (core.inner_steps, core.overlap_steps, core.rounds) == (2, 1, 1)
        assert not core.sync_pending and not core.sync_ready
        with pytest.raises(fedwan.Error, match=r"no sync is pending; call begin_sync\(\) first"):
            core.finish_sync()
        with pytest.raises(fedwan.Error, match=r"SiteCore.wait_sync\(\): no sync is pending"):
            core.wait_sync(0.01)
        with pytest.raises(fedwan.Error, match=r"call join\(\) before begin_sync\(\)"):
            core.begin_sync()
        core.join()
        fedwan.synthetic_local_steps(params, 1, 2, SEED)
        sent = params.copy()
        assert core.begin_sync() is None
        assert core.sync_pending and core.round == 0 and not core.finished
        with pytest.raises(fedwan.Error,
                           match=r"a sync is already pending; call finish_sync\(\) first"):
            core.begin_sync()
        with pytest.raises(fedwan.Error, match=r"a sync is pending; call finish_sync\(\) first"):
            core.sync()
        with pytest.raises(fedwan.Error,
                           match=r"SiteCore.checkpoint\(\): a sync is pending .*finish_sync"):
            core.checkpoint()
        assert core.service()["round"] == 0  # it only reports meanwhile
        params += 1.0  # training goes on: the update was copied
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        while not core.sync_ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert core.sync_ready and core.sync_pending
        result = core.finish_sync()
        assert result["finished"] and result["round"] == 1
        assert core.finished and core.round == 1
        assert not core.sync_pending and not core.sync_ready
        with pytest.raises(fedwan.Error, match="no sync is pending"):
            core.finish_sync()
        with pytest.raises(fedwan.Error, match="no sync is pending"):
            core.wait_sync(0.01)
        with pytest.raises(fedwan.Error, match="already finished"):
            core.begin_sync()
    join_all([root])
    final = root.result["global_model"]
    # The federation ended: params hold its final model, the steps are gone.
    assert np.array_equal(params, final)
    np.testing.assert_allclose(final, sent, rtol=0, atol=1e-6)  # one site, FedAvg lr 1


def test_stop_or_ctrl_c_ends_a_waiting_finish_sync(sock_dir, credentials):
    sites = ("site-0", "site-1", "site-2")
    topo = fedwan.Topology.parse(topology_yaml(
        "py-overlap-stop", sock_dir, [(s, "root", 1) for s in sites], rounds=2,
        inner_steps=2, overlap_steps=2))
    initial = fedwan.synthetic_initial_model(64, SEED)
    agg = fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                            credentials=credentials(topo, "root"))
    root = Worker("root", agg.run)
    root.start()
    cores = {s: fedwan.SiteCore(topo, s, initial.copy(), join_timeout_s=JOIN_TIMEOUT_S,
                                round_timeout_s=60, credentials=credentials(topo, s))
             for s in sites}
    joins = [Worker(s, core.join) for s, core in cores.items()]
    for w in joins:
        w.start()
    join_all(joins)
    try:
        # site-2 sends no update until the end: round 0 never closes.
        core = cores["site-0"]
        core.begin_sync()
        time.sleep(0.2)
        assert core.sync_pending and not core.sync_ready
        error = stop_while_running("site-0", core.finish_sync, core.stop, limit_s=3)
        assert isinstance(error, fedwan.StoppedError), repr(error)
        del error
        assert not core.sync_pending
        with pytest.raises(fedwan.Error, match="an overlapped sync failed; build a new SiteCore"):
            core.begin_sync()

        # Ctrl-C (SIGINT's handler in the main thread) while finish_sync() waits.
        core = cores["site-1"]
        core.begin_sync()
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            core.finish_sync()
        assert time.monotonic() - started < 2.5
        timer.join()
        assert not core.sync_pending

        # Closing a core whose sync is pending stops and joins its worker.
        core = cores["site-2"]
        core.begin_sync()
        started = time.monotonic()
        core.close()
        assert time.monotonic() - started < 3 and core.closed and not core.sync_pending
    finally:
        agg.stop()
        for c in cores.values():
            c.close()
    root.join(30)
    assert not root.is_alive()


# -- fedwan.Site --------------------------------------------------------------------

# Powers of two: SGD's p - lr * (p - t) is what the reference computes; two
# rates, as SITE_LR says why.
LRS = (0.25, 0.125)


def make_model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))


def flat_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def test_overlapped_sites_train_to_the_reference_model(sock_dir, credentials, monkeypatch):
    """Two torch sites, one sharing its parameters with the runtime and one
    mirroring them (as a GPU site does), on 0.5 * ||p - target||^2."""
    rounds, inner_steps, tau, weights = 3, 3, 2, (3.0, 1.0)
    topo = fedwan.Topology.parse(topology_yaml(
        "py-overlap-site", sock_dir, [("site-0", "root", 3), ("site-1", "root", 1)],
        rounds=rounds, inner_steps=inner_steps, overlap_steps=tau))
    initial = flat_of(make_model())
    gen = torch.Generator().manual_seed(5)
    targets = [torch.randn(initial.size, generator=gen) for _ in range(2)]
    models = {"site-0": make_model(), "site-1": make_model()}
    mirrored = {id(p) for p in models["site-1"].parameters()}
    monkeypatch.setattr(fedwan.site, "_can_share",
                        lambda ts: not any(id(t) in mirrored for t in ts))

    def site(i):
        node_id = f"site-{i}"
        model = models[node_id]
        opt = torch.optim.SGD(model.parameters(), lr=LRS[i])
        results, steps, pending = [], 0, 0
        with fedwan.Site(model, opt, topology=topo, node_id=node_id,
                         join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, node_id)) as s:
            assert s.overlap_steps == tau and s._shared == (i == 0)
            while not s.finished:
                opt.zero_grad()
                params = torch.cat([p.reshape(-1) for p in model.parameters()])
                (0.5 * ((params - targets[i]) ** 2).sum()).backward()
                opt.step()
                steps += 1
                result = s.step()
                pending += s.sync_pending
                if result is not None:
                    results.append(result)
            assert not s.sync_pending
        return flat_of(model), results, steps, pending

    workers = [Worker("root", lambda: run_root(topo, initial, credentials))] + [
        Worker(f"site-{i}", lambda i=i: site(i)) for i in range(2)]
    for w in workers:
        w.start()
    join_all(workers, timeout=60)
    got = workers[0].result["global_model"]

    def sgd(t, lr):
        def step(x, k):
            for _ in range(k):
                x = x - np.float32(lr) * (x - t)
            return x
        return step

    steps = [sgd(t.numpy(), lr) for t, lr in zip(targets, LRS)]
    want = reference(initial, steps, weights, rounds, inner_steps, tau)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    blocking = reference(initial, steps, weights, rounds, inner_steps, 0)
    assert np.abs(want - blocking).max() > 1e-3, "the check could not tell the modes apart"
    for w in workers[1:]:
        final, results, steps, pending = w.result
        assert np.array_equal(final, got), f"{w.name} does not hold the final model"
        # Updates stay H steps apart; the last round's merge follows its update.
        assert steps == rounds * inner_steps
        assert [r["round"] for r in results] == list(range(1, rounds + 1))
        assert results[-1]["finished"]
        assert pending == (rounds - 1) * tau  # steps taken while a sync was in flight


def test_site_sync_merges_a_pending_sync_first(sock_dir, credentials):
    topo = fedwan.Topology.parse(topology_yaml(
        "py-overlap-sync", sock_dir, [("site-0", "root", 1)], rounds=2, inner_steps=2,
        overlap_steps=1))
    root = Worker("root", lambda: run_root(topo, flat_of(make_model()), credentials))
    root.start()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.linspace(-1, 1, 36).reshape(3, 12), torch.ones(3, 4)
    with fedwan.Site(model, opt, topology=topo, node_id="site-0",
                     join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                     credentials=credentials(topo, "site-0")) as site:
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            assert site.step() is None
        assert site.sync_pending and site.round == 0 and not site.finished
        site.checkpoint()  # a no-op while the sync is in flight
        result = site.sync()  # merges round 0's model, then syncs round 1
        assert result["finished"] and result["round"] == 2
        assert site.finished and not site.sync_pending
    join_all([root])
    assert np.array_equal(flat_of(model), root.result["global_model"])
