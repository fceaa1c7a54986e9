"""fedwan.Site(model, optimizer, ...): the keyword form, the optimizer check,
the context manager (join on entry, close on exit, a checkpoint when the
block is cut short) and mirrored (non-shared) parameters, against a
federation of threads."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import fedwan
import fedwan.site
from helpers import JOIN_TIMEOUT_S, ROUND_TIMEOUT_S, Worker, join_all, topology_yaml

torch = pytest.importorskip("torch")

SEED = 3


def make_model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def flat_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


@pytest.fixture
def topo(sock_dir):
    return fedwan.Topology.parse(topology_yaml(
        "py-site-model", sock_dir, [("site-0", "root", 1), ("site-1", "root", 1)],
        rounds=2, inner_steps=2))


def run_root(topo, initial, credentials):
    agg = fedwan.Aggregator(topo, "root", initial_model=initial,
                            join_timeout_s=JOIN_TIMEOUT_S,
                            credentials=credentials(topo, "root"))
    return agg.run()


def train(site, model, opt):
    """A few SGD steps on a fixed regression target until the federation ends."""
    x = torch.linspace(-1, 1, 24).reshape(4, 6)
    y = torch.ones(4, 3)
    while not site.finished:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        site.step()


def test_keyword_form_and_context_manager_train_a_federation(topo, credentials, monkeypatch):
    initial = flat_of(make_model())
    root = Worker("root", lambda: run_root(topo, initial, credentials))
    root.start()
    models = {}
    for node_id in ("site-0", "site-1"):
        models[node_id] = make_model()
        with torch.no_grad():  # start away from the root's model: join must load it
            for p in models[node_id].parameters():
                p.add_(1.0)
    # site-1 mirrors its parameters as a GPU site does (copies around each
    # call) instead of sharing one buffer; both must end on the same model.
    mirrored = {id(p) for p in models["site-1"].parameters()}
    monkeypatch.setattr(fedwan.site, "_can_share",
                        lambda ts: not any(id(t) in mirrored for t in ts))

    def site(node_id):
        model = models[node_id]
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with fedwan.Site(model, opt, topology=topo, node_id=node_id,
                         join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, node_id)) as s:
            assert np.array_equal(flat_of(model), initial), "entering the block joins"
            assert s.round == 0 and not s.finished and s.is_leader
            assert s._shared == (node_id == "site-0")
            train(s, model, opt)
        assert s.closed
        with pytest.raises(fedwan.Error, match="closed"):
            s.sync()
        return flat_of(model)

    sites = [Worker(n, lambda n=n: site(n)) for n in ("site-0", "site-1")]
    for w in sites:
        w.start()
    join_all(sites + [root], timeout=60)
    summary = root.result
    final = np.asarray(summary["global_model"])
    assert summary["rounds"] == 2
    assert not np.array_equal(final, initial)
    assert np.array_equal(sites[0].result, final)
    assert np.array_equal(sites[1].result, final)


def test_optimizer_over_other_tensors_is_refused(topo, credentials):
    model, other = make_model(), make_model()
    opt = torch.optim.Adam(other.parameters())
    with pytest.raises(fedwan.ConfigError, match="not one of the site's parameters"):
        fedwan.Site(model, opt, topology=topo, node_id="site-0",
                    credentials=credentials(topo, "site-0"))
    with pytest.raises(fedwan.ConfigError, match="not a torch.optim.Optimizer"):
        fedwan.Site(model, "sgd", topology=topo, node_id="site-0",
                    credentials=credentials(topo, "site-0"))


def test_forms_that_cannot_work_are_refused(topo, credentials):
    model = make_model()
    c = credentials(topo, "site-0")
    with pytest.raises(fedwan.ConfigError, match="needs topology="):
        fedwan.Site(model, credentials=c)
    with pytest.raises(fedwan.ConfigError, match="not both"):
        fedwan.Site(topo, "site-0", model.parameters(), topology=topo, credentials=c)
    with pytest.raises(fedwan.ConfigError, match="torch.nn.Module or an iterable"):
        fedwan.Site(42, topology=topo, node_id="site-0", credentials=c)
    with pytest.raises(fedwan.ConfigError, match="not a site"):
        fedwan.Site(model, topology=topo, node_id="root", credentials=c)


def test_leaving_the_block_on_an_error_checkpoints_and_closes(topo, credentials, tmp_path):
    initial = flat_of(make_model())
    root = Worker("root", lambda: run_root(topo, initial, credentials))
    root.start()
    ckpt = tmp_path / "ckpt"

    def site_0():
        # A first run whose training loop fails inside the block, after the
        # join: leaving the block checkpoints and closes the link ...
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s = fedwan.Site(model, opt, topology=topo, node_id="site-0",
                        join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                        credentials=credentials(topo, "site-0"), checkpoint_dir=ckpt)
        with pytest.raises(ZeroDivisionError):
            with s:
                assert np.array_equal(flat_of(model), initial)
                1 / 0
        assert s.closed
        assert any(ckpt.iterdir()), "a checkpoint was written on the way out"
        # ... and a new Site resumes from it; the federation completes.
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with fedwan.Site(model, opt, topology=topo, node_id="site-0",
                         join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, "site-0"), checkpoint_dir=ckpt) as s:
            train(s, model, opt)
        return flat_of(model)

    def other_site():
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with fedwan.Site(model, opt, topology=topo, node_id="site-1",
                         join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                         credentials=credentials(topo, "site-1")) as s:
            train(s, model, opt)
        return flat_of(model)

    sites = [Worker("site-0", site_0), Worker("site-1", other_site)]
    for s in sites:
        s.start()
    join_all(sites + [root], timeout=60)
    final = np.asarray(root.result["global_model"])
    assert all(np.array_equal(s.result, final) for s in sites)


def test_site_core_closes_and_refuses_later_calls(topo, credentials):
    params = np.zeros(8, dtype=np.float32)
    with fedwan.SiteCore(topo, "site-0", params, credentials=credentials(topo, "site-0")) as core:
        assert not core.closed
    assert core.closed
    core.close()  # idempotent
    core.stop()   # a no-op once closed
    for call in (core.join, core.sync, core.service, core.checkpoint):
        with pytest.raises(fedwan.Error, match="closed"):
            call()


def test_sigint_stops_a_site_blocked_in_sync_within_a_second(topo, credentials):
    """A real SIGINT (as Ctrl-C sends) while the main thread is blocked in
    Site.sync(): KeyboardInterrupt within a second, the site stopped."""
    initial = flat_of(make_model())
    agg = fedwan.Aggregator(topo, "root", initial_model=initial, join_timeout_s=JOIN_TIMEOUT_S,
                            credentials=credentials(topo, "root"))
    root = Worker("root", agg.run)
    root.start()
    # site-1 joins, then never sends its update: site-0's sync waits for the round.
    other = fedwan.SiteCore(topo, "site-1", initial.copy(), join_timeout_s=JOIN_TIMEOUT_S,
                            credentials=credentials(topo, "site-1"))
    joined = Worker("site-1", other.join)
    joined.start()
    model = make_model()
    site = fedwan.Site(model, topology=topo, node_id="site-0", join_timeout_s=JOIN_TIMEOUT_S,
                       round_timeout_s=60, credentials=credentials(topo, "site-0"))
    site.join()
    join_all([joined])
    sent = []

    def ctrl_c():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(0.5, ctrl_c)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            site.sync()
        elapsed = time.monotonic() - sent[0]
    finally:
        timer.join()
        agg.stop()
        other.stop()
    assert elapsed < 1.0, f"KeyboardInterrupt {elapsed:.2f} s after SIGINT"
    with pytest.raises(fedwan.StoppedError):  # the site was stopped
        site.sync()
    site.close()
    other.close()
    root.join(30)
    assert not root.is_alive()
