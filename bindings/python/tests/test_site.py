"""fedwan.Site and fedwan.SiteCore argument handling: the shared buffer, and
clear ConfigErrors for parameters or arrays they cannot use."""

import _thread
import threading
import time

import numpy as np
import pytest

import fedwan
from helpers import stop_while_running, topology_yaml

torch = pytest.importorskip("torch")


@pytest.fixture
def topo(sock_dir):
    return fedwan.Topology.parse(topology_yaml(
        "py-site", sock_dir, [("site-0", "root", 1), ("site-1", "root", 1)]))


@pytest.fixture
def creds(topo, credentials):
    """node_id -> its bundle in the provisioned federation of `topo`."""
    return lambda node_id: credentials(topo, node_id)


def test_site_flattens_parameters_into_one_shared_buffer(topo, creds):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = [p.detach().clone() for p in model.parameters()]
    site = fedwan.Site(topo, "site-0", model.parameters(), credentials=creds("site-0"))
    assert site.numel == 3 * 4 + 4 + 4 * 2 + 2
    assert site.flat.dtype == torch.float32 and site.flat.is_contiguous()
    assert site.inner_steps == 2 and site.round == 0 and not site.finished
    # Values are kept, shapes too; every parameter is now a slice of flat.
    for p, old in zip(model.parameters(), before):
        assert p.shape == old.shape and torch.equal(p.detach(), old)
    flat = site.flat
    flat[0] = 42.0
    assert model[0].weight[0, 0].item() == 42.0
    # The optimizer writes into the buffer fedwan sends from.
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert flat[0].item() == 41.0 and flat[-1].item() == before[-1][-1].item() - 1.0
    # The model still trains through autograd on the views.
    model(torch.ones(1, 3)).sum().backward()
    assert model[0].weight.grad is not None


def test_site_rejects_parameters_it_cannot_share(topo, creds):
    c = creds("site-0")
    with pytest.raises(fedwan.ConfigError, match=r"parameter 0 .* is torch.float64.*model.float\(\)"):
        fedwan.Site(topo, "site-0", torch.nn.Linear(2, 2).double().parameters(), credentials=c)
    meta = torch.nn.Parameter(torch.empty(4, device="meta"))
    with pytest.raises(fedwan.ConfigError, match=r"is on meta.*CPU tensors only"):
        fedwan.Site(topo, "site-0", [meta], credentials=c)
    with pytest.raises(fedwan.ConfigError, match="not a torch tensor"):
        fedwan.Site(topo, "site-0", [np.zeros(3, np.float32)], credentials=c)
    with pytest.raises(fedwan.ConfigError, match="at least one parameter"):
        fedwan.Site(topo, "site-0", [], credentials=c)


def test_site_rejects_nodes_that_are_not_its_sites(topo, creds, sock_dir):
    params = list(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(fedwan.ConfigError, match="'root' is a root, not a site"):
        fedwan.Site(topo, "root", params, credentials=creds("root"))
    with pytest.raises(fedwan.ConfigError, match="'site-9' is not in topology 'py-site'"):
        fedwan.Site(topo, "site-9", params, credentials=creds("site-0"))
    path = f"{sock_dir}/federation.yaml"
    with open(path, "w") as f:
        f.write(topo.to_yaml())
    assert fedwan.Site(path, "site-1", params, credentials=creds("site-1")).numel == 6


def test_site_core_checks_its_array(topo, creds):
    c = creds("site-0")
    with pytest.raises(fedwan.ConfigError, match="dtype float32, not float64"):
        fedwan.SiteCore(topo, "site-0", np.zeros(8), credentials=c)
    with pytest.raises(fedwan.ConfigError, match="C-contiguous"):
        fedwan.SiteCore(topo, "site-0", np.zeros(16, np.float32)[::2], credentials=c)
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(fedwan.ConfigError, match="read-only"):
        fedwan.SiteCore(topo, "site-0", frozen, credentials=c)
    with pytest.raises(fedwan.ConfigError, match="empty"):
        fedwan.SiteCore(topo, "site-0", np.zeros(0, np.float32), credentials=c)
    with pytest.raises(fedwan.ConfigError, match="join_timeout_s must be a finite number"):
        fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), join_timeout_s=0, credentials=c)
    with pytest.raises(fedwan.ConfigError, match="fedwan.Topology or the path"):
        fedwan.SiteCore(42, "site-0", np.zeros(8, np.float32), credentials=c)
    for budget in (0.0, -1.0, 1.5, float("nan")):
        with pytest.raises(fedwan.ConfigError, match="checkpoint_budget .* not a share"):
            fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), credentials=c,
                            checkpoint_budget=budget)


def test_site_core_keeps_its_array_alive_and_uses_it_in_place(topo, creds):
    core = fedwan.SiteCore(topo, "site-0", np.arange(8, dtype=np.float32),
                           credentials=creds("site-0"))
    # The only reference left is the SiteCore's own.
    assert core.params.base is None and np.array_equal(core.params, np.arange(8))
    params = np.ones(8, np.float32)
    core = fedwan.SiteCore(topo, "site-0", params, credentials=creds("site-0"))
    assert core.params is params


def test_stop_from_another_thread_ends_a_blocked_join(topo, creds):
    # No parent at all: join() would wait its whole 60 s join timeout.
    core = fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), join_timeout_s=60,
                           credentials=creds("site-0"))
    error = stop_while_running("site-0", core.join, core.stop, after_s=0.3, limit_s=3)
    assert isinstance(error, fedwan.StoppedError), repr(error)
    assert isinstance(error, fedwan.Error)
    assert "site 'site-0' stopped while joining" in str(error)
    # Stopped for good: a later call raises at once.
    with pytest.raises(fedwan.StoppedError):
        core.join()
    del error, core  # its traceback holds the SiteCore


def test_ctrl_c_stops_a_blocked_join_within_a_second(topo, creds):
    core = fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), join_timeout_s=60,
                           credentials=creds("site-0"))
    # As Ctrl-C does: SIGINT's handler runs in the main thread, blocked in join().
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        core.join()
    assert time.monotonic() - started < 2.5
    timer.join()
    with pytest.raises(fedwan.StoppedError):  # the site was stopped
        core.join()
    del core


def test_join_times_out_when_the_parent_does_not_answer(topo, creds):
    # The root binds its endpoint but never runs: the site's TLS handshake,
    # its first message, is taken and never answered.
    root = fedwan.Aggregator(topo, "root", np.zeros(8, np.float32), credentials=creds("root"))
    core = fedwan.SiteCore(topo, "site-0", np.zeros(8, np.float32), join_timeout_s=0.3,
                           credentials=creds("site-0"))
    with pytest.raises(fedwan.TimeoutError,
                       match=r"TLS handshake with parent .*root\.sock did not complete within "
                             r"300 ms: is the parent running"):
        core.join()
    with pytest.raises(fedwan.Error, match="call join"):
        core.sync()
    del core, root
