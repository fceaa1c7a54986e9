"""The fedwan API used as a typed program would use it.

scripts/typecheck.sh checks this file with ``mypy --strict`` against the
package as installed (its inline annotations and the extension's stubs,
fedwan/_fedwan.pyi); test_api.py runs main(), so that what the file states
about the types is also what happens. Not a pytest module (no ``test_``
prefix): a federation of a root and two sites, as threads over ipc://
sockets in plaintext, on the synthetic workload (and a torch model, when
torch is installed).
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import numpy.typing as npt

import fedwan

N, SEED, ROUNDS, INNER_STEPS = 8, 11, 2, 3  # N: the torch site's Linear(3, 2)
Model = npt.NDArray[np.float32]


def topology_text(sock_dir: str) -> str:
    endpoint = "ipc://" + os.path.join(sock_dir, "root.sock")
    return (
        "job: typing-usage\n"
        f"federation: {{rounds: {ROUNDS}, inner_steps: {INNER_STEPS}, codec: fp16, "
        "chunk_bytes: 4096, round_timeout_s: 20, outer_optimizer: {name: diloco}}\n"
        "nodes:\n"
        f'  - {{id: root, role: root, endpoint: "{endpoint}"}}\n'
        "  - {id: site-0, role: site, parent: root, weight: 1}\n"
        "  - {id: site-1, role: site, parent: root, weight: 2}\n"
    )


def describe(topo: fedwan.Topology) -> Dict[str, float]:
    """The site weights under the root, read through the typed properties."""
    fed: fedwan.FederationSpec = topo.federation
    outer: fedwan.OuterOptimizerSpec = fed.outer_optimizer
    lr: Optional[float] = outer.lr  # unset in the file: the optimizer's default
    assert lr is None and outer.name == topo.outer_optimizer == "diloco"
    assert fed.rounds == topo.rounds and topo.codec in fedwan.codec_names()
    found: Optional[fedwan.NodeSpec] = topo.find("nowhere")
    assert found is None and topo.residency_refusal("site-0", "root") is None
    assert len(topo.digest) == 32 and topo.digest_hex() == topo.digest.hex()
    weights: Dict[str, float] = {}
    for node in topo.nodes:
        parent: Optional[str] = node.parent
        if node.role == "site" and parent is not None:
            weights[node.id] = topo.weight_under(node.id)
    assert sum(weights.values()) == topo.weight_under(topo.root.id)
    return weights


def round_trip(codec: str, values: Model) -> float:
    """Encodes with error feedback and decodes; returns the largest error."""
    residual: Model = np.zeros_like(values)
    data: bytes = fedwan.encode(codec, values, residual)
    assert len(data) == fedwan.encoded_size(codec, values.size)
    assert fedwan.validate(codec, bytearray(data), values.size)
    decoded: Model = fedwan.decode(codec, memoryview(data), values.size)
    return float(np.max(np.abs(decoded - values)))


def numpy_site(topo: fedwan.Topology, node_id: str, initial: Model) -> List[int]:
    """A site over a NumPy array; returns the bytes it sent each sync."""
    params = initial.copy()
    sent: List[int] = []
    with fedwan.SiteCore(topo, node_id, params, join_timeout_s=20.0,
                         insecure_plaintext=True) as core:
        joined = core.join()
        assert joined["round"] == core.round and not joined["resynced"]
        index = topo.node(node_id).index
        while not core.finished:
            fedwan.synthetic_local_steps(params, index, core.inner_steps, SEED)
            result = core.sync()
            sent.append(result["bytes_sent"])
        assert core.params is params and core.alarms == []
    assert core.closed
    return sent


def torch_site(topo: fedwan.Topology, node_id: str) -> int:
    """A site over a torch model (fedwan.Site); returns the rounds it saw."""
    import torch

    model = torch.nn.Linear(3, 2)
    assert sum(p.numel() for p in model.parameters()) == N
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(4, 3), torch.zeros(4, 2)
    rounds = 0
    with fedwan.Site(model, opt, topology=topo, node_id=node_id,
                     insecure_plaintext=True, join_timeout_s=20.0) as site:
        while not site.finished:
            opt.zero_grad()
            # autograd.backward rather than Tensor.backward: typed in torch 1.13 too.
            torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            result = site.step()
            if result is not None:
                rounds += 1
        assert site.numel == N and site.node_id == node_id
    return rounds


def rejected_by_the_stubs(topo: fedwan.Topology, params: Model) -> None:
    """Never called: each line is a mistake the types must catch. mypy
    --strict reports an ignore comment that silences nothing, so a stub that
    grew too permissive fails the check here."""
    fedwan.encode("fp16", [1.0, 2.0])  # type: ignore[arg-type]
    fedwan.Topology.load(b"federation.yaml")  # type: ignore[arg-type]
    fedwan.SiteCore(topo, "site-0", params, 10.0, 5.0)  # type: ignore[call-arg]
    fedwan.SiteCore(topo, "site-0", params).join()["rounds"]  # type: ignore[typeddict-item]
    topo.rounds = 3  # type: ignore[misc]
    node: fedwan.NodeSpec = topo.find("root")  # type: ignore[assignment]

    def on_model(model: Model) -> None:  # on_model also gets the round
        pass

    fedwan.Aggregator(topo, "root", on_model=on_model)  # type: ignore[arg-type]
    del node


class Root:
    """The root on a thread, recording what its callbacks were given."""

    def __init__(self, topo: fedwan.Topology, initial: Model) -> None:
        self.rounds_seen: List[int] = []
        self.models: List[Model] = []
        self.summary: Optional[Mapping[str, Any]] = None
        self.error: Optional[fedwan.Error] = None
        self._agg = fedwan.Aggregator(topo, "root", initial_model=initial,
                                      on_round=self.on_round, on_model=self.on_model,
                                      join_timeout_s=20.0, insecure_plaintext=True)
        self._thread = threading.Thread(target=self._run, name="root", daemon=True)

    # A TypedDict is a Mapping[str, object]: a callback needs no private name.
    def on_round(self, report: Mapping[str, object]) -> None:
        round_ = report["round"]
        assert isinstance(round_, int)
        self.rounds_seen.append(round_)

    def on_model(self, round_: int, model: Model) -> None:
        self.models.append(model)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> Mapping[str, Any]:
        self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the root did not finish"
        return self.summary

    def _run(self) -> None:
        try:
            summary = self._agg.run()
            model = summary["global_model"]
            assert model is not None and model.dtype == np.float32
            assert [r["round"] for r in summary["reports"]] == self.rounds_seen
            self.summary = summary
        except fedwan.Error as e:
            self.error = e


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fw") as sock_dir:
        topo = fedwan.Topology.parse(topology_text(sock_dir), source="typing_usage")
        assert describe(topo) == {"site-0": 1.0, "site-1": 2.0}
        initial = fedwan.synthetic_initial_model(N, SEED)
        assert round_trip("fp16", initial) < 1e-3
        try:
            import torch  # noqa: F401
            have_torch = True
        except ImportError:
            have_torch = False

        root = Root(topo, initial)
        root.start()
        results: Dict[str, object] = {}

        def site(node_id: str) -> None:
            if node_id == "site-1" and have_torch:
                results[node_id] = torch_site(topo, node_id)
            else:
                results[node_id] = numpy_site(topo, node_id, initial)

        threads = [threading.Thread(target=site, args=(s,), daemon=True)
                   for s in ("site-0", "site-1")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        summary = root.join(60.0)
        assert summary["rounds"] == ROUNDS and len(root.models) == ROUNDS
        assert len(results) == 2, f"a site did not finish: {sorted(results)}"

    try:
        fedwan.Topology.parse("job: x\nnodes: []\n")
    except fedwan.ConfigError as e:
        assert "nodes" in str(e)
    else:
        raise AssertionError("an empty topology parsed")


if __name__ == "__main__":
    main()
