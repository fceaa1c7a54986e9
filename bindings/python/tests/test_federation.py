"""Whole federations in one process: aggregators and sites as threads over
ipc:// sockets with mutual TLS links, checked against a NumPy FedAvg
reference."""

import numpy as np
import pytest

import fedwan
from helpers import JOIN_TIMEOUT_S, ROUND_TIMEOUT_S, Worker, join_all, topology_yaml

torch = pytest.importorskip("torch")

LR = 0.25  # a power of two: lr * g is exact, so fused and unfused SGD agree


def make_model(seed):
    torch.manual_seed(seed)
    # 1540 parameters: two 4 KiB chunks, so chunking is exercised.
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 10))


def flat_numpy(model):
    """The model's own tensors, concatenated (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train_site(topo, node_id, model, targets, credentials):
    """A site's loop: SGD on 0.5 * ||p - target||^2, a deterministic update
    a NumPy reference can reproduce bit for bit: p <- p - lr * (p - t)."""
    site = fedwan.Site(topo, node_id, model.parameters(), join_timeout_s=JOIN_TIMEOUT_S,
                       round_timeout_s=ROUND_TIMEOUT_S, credentials=credentials)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    joined = site.join()
    after_join = flat_numpy(model)
    syncs, steps = [], 0
    while not site.finished:
        opt.zero_grad()
        loss = sum(0.5 * ((p - t) ** 2).sum() for p, t in zip(model.parameters(), targets))
        loss.backward()
        opt.step()
        steps += 1
        result = site.step()
        if result is not None:
            syncs.append(result)
    return {"site": site, "joined": joined, "after_join": after_join, "syncs": syncs,
            "steps": steps}


def reference_fedavg(initial, targets, weights, rounds, inner_steps):
    """FedAvg over fp32 the way the protocol defines it. Returns the root's
    global model and the model the sites hold (the root sends each round the
    difference to what the sites hold, which they add)."""
    f32 = np.float32
    global_model = initial.copy()
    held = initial.copy()
    for _ in range(rounds):
        acc = np.zeros_like(initial)
        for target, w in zip(targets, weights):
            x = held.copy()
            for _ in range(inner_steps):
                x = x - f32(LR) * (x - target)
            delta = held - x                      # anchor - local: the pseudo-gradient
            acc = acc + f32(w) * delta            # product rounded to fp32, then the add
        mean = acc / f32(sum(weights))
        global_model = global_model - f32(1.0) * mean   # fedavg, lr 1
        held = held + (global_model - held)
    return global_model, held


def test_fedavg_two_sites_matches_numpy_reference_bit_for_bit(sock_dir, credentials):
    rounds, inner_steps, weights = 3, 2, (3.0, 1.0)
    topo = fedwan.Topology.parse(topology_yaml(
        "py-fedavg", sock_dir, [("site-0", "root", 3), ("site-1", "root", 1)],
        rounds=rounds, inner_steps=inner_steps, codec="fp32"))

    # site-0 starts from the root's model (the join sends no model); site-1
    # from another one (the join sends it the root's in full).
    models = [make_model(0), make_model(1)]
    initial = flat_numpy(make_model(0))
    assert np.array_equal(flat_numpy(models[0]), initial)
    assert not np.array_equal(flat_numpy(models[1]), initial)
    gen = torch.Generator().manual_seed(7)
    targets = [[torch.randn(p.shape, generator=gen) * 0.5 for p in models[0].parameters()]
               for _ in models]

    seen_models, seen_rounds = [], []
    root = fedwan.Aggregator(topo, "root", initial,
                             on_model=lambda r, g: seen_models.append((r, g)),
                             on_round=seen_rounds.append,
                             join_timeout_s=JOIN_TIMEOUT_S, round_timeout_s=ROUND_TIMEOUT_S,
                             credentials=credentials(topo, "root"))
    workers = [Worker("root", root.run)] + [
        Worker(f"site-{i}", lambda i=i: train_site(topo, f"site-{i}", models[i], targets[i],
                                                   credentials(topo, f"site-{i}")))
        for i in range(2)]
    for w in workers:
        w.start()
    join_all(workers)
    summary = workers[0].result

    flat_targets = [torch.cat([t.reshape(-1) for t in ts]).numpy() for ts in targets]
    want_global, want_held = reference_fedavg(initial, flat_targets, weights, rounds, inner_steps)
    got_global = summary["global_model"]
    assert got_global.dtype == np.float32 and got_global.shape == initial.shape
    assert np.array_equal(got_global, want_global)
    assert not np.array_equal(got_global, initial)

    for i, w in enumerate(workers[1:]):
        out = w.result
        site = out["site"]
        assert site.finished and site.round == rounds
        assert out["steps"] == rounds * inner_steps
        assert [s["round"] for s in out["syncs"]] == [1, 2, 3]
        assert out["syncs"][-1]["finished"]
        assert all(s["bytes_sent"] > 0 and s["bytes_received"] > 0 for s in out["syncs"])
        # Both sites start round 0 from the root's model.
        assert np.array_equal(out["after_join"], initial), f"site-{i} did not get the model"
        # The model's own tensors hold the final model: the views are shared.
        final = flat_numpy(models[i])
        assert np.array_equal(final, want_held)
        assert np.array_equal(final, got_global)
        assert np.array_equal(site.flat.numpy(), final)
        offset = 0
        for p in models[i].parameters():
            assert p.data_ptr() == site.flat.data_ptr() + 4 * offset
            offset += p.numel()

    assert summary["rounds"] == rounds and len(summary["reports"]) == rounds
    assert summary["wan_bytes_total"] > 0
    assert summary["wan_bytes_total"] == sum(r["wan_bytes"] for r in summary["reports"])
    assert summary["fp32_bytes_total"] > 0
    assert summary["rejected_frames"] == 0
    assert summary["security_mode"] == "mtls/aes-256-gcm"
    assert len(summary["handshake_ms"]) == 2
    # A healthy federation rides out nothing (see test_security.py for alarms).
    assert summary["alarms"] == []
    assert [r["round"] for r in summary["reports"]] == [0, 1, 2]
    assert all(r["weight"] == 4.0 and r["frames"] > 0 for r in summary["reports"])
    assert seen_rounds == summary["reports"]
    assert [r for r, _ in seen_models] == [0, 1, 2]
    assert np.array_equal(seen_models[-1][1], got_global)


@pytest.mark.parametrize("page_out_from_bytes", [None, 0])
def test_region_tree_over_numpy_site_cores_with_fp16(sock_dir, credentials, page_out_from_bytes):
    """root -> region -> 2 sites, the sites as SiteCore over NumPy arrays
    trained with the synthetic workload; fp16 on the wire. With
    page_out_from_bytes=0 the sites keep their anchor and update frames in
    files, as a large model's are, and end the same way."""
    rounds, inner_steps, n, seed = 4, 3, 3000, 11
    topo = fedwan.Topology.parse(topology_yaml(
        "py-region", sock_dir, [("a", "eu", 2), ("b", "eu", 1)], regions=["eu"],
        rounds=rounds, inner_steps=inner_steps, codec="fp16"))
    initial = fedwan.synthetic_initial_model(n, seed)

    def site(node_id):
        index = topo.node(node_id).index
        params = initial.copy()
        core = fedwan.SiteCore(topo, node_id, params, join_timeout_s=JOIN_TIMEOUT_S,
                               round_timeout_s=ROUND_TIMEOUT_S,
                               credentials=credentials(topo, node_id),
                               page_out_from_bytes=page_out_from_bytes)
        core.join()
        while not core.finished:
            fedwan.synthetic_local_steps(params, index, inner_steps, seed)
            core.sync()
        return params

    root = fedwan.Aggregator(topo, "root", initial, join_timeout_s=JOIN_TIMEOUT_S,
                             round_timeout_s=ROUND_TIMEOUT_S,
                             credentials=credentials(topo, "root"))
    region = fedwan.Aggregator(topo, "eu", join_timeout_s=JOIN_TIMEOUT_S,
                               round_timeout_s=ROUND_TIMEOUT_S,
                               credentials=credentials(topo, "eu"))
    workers = [Worker("root", root.run), Worker("eu", region.run),
               Worker("a", lambda: site("a")), Worker("b", lambda: site("b"))]
    for w in workers:
        w.start()
    join_all(workers)
    root_summary, region_summary = workers[0].result, workers[1].result

    # The same federation in fp32 NumPy: sites step from the global model.
    want = initial.copy()
    for _ in range(rounds):
        locals_ = []
        for node_id in ("a", "b"):
            x = want.copy()
            fedwan.synthetic_local_steps(x, topo.node(node_id).index, inner_steps, seed)
            locals_.append(x)
        want = want - (np.float32(2) * (want - locals_[0]) + (want - locals_[1])) / np.float32(3)
    got = root_summary["global_model"]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)
    assert np.abs(got - initial).max() > 0.1  # it did train
    for w in workers[2:]:
        np.testing.assert_allclose(w.result, got, rtol=0, atol=2e-3)

    assert region_summary["global_model"] is None
    # Every link is mutual TLS: the root's one child (the region) and the
    # region's two sites each came up through a handshake.
    assert root_summary["security_mode"] == region_summary["security_mode"] == "mtls/aes-256-gcm"
    assert len(root_summary["handshake_ms"]) == 1
    assert len(region_summary["handshake_ms"]) >= 2
    assert all(ms > 0 for ms in root_summary["handshake_ms"] + region_summary["handshake_ms"])
    assert root_summary["rounds"] == rounds and region_summary["rounds"] == rounds
    # fp16 halves the traffic of the model-sized frames.
    assert 0 < root_summary["wan_bytes_total"] < 0.6 * root_summary["fp32_bytes_total"]
    assert region_summary["wan_bytes_total"] < root_summary["wan_bytes_total"]
