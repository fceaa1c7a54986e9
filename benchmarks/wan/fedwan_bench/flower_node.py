"""The Flower baseline's two programs, run with a Python that has `flwr`
(pip install flwr): a FedAvg server in the root's namespace and one NumPy
client per site namespace, training the same synthetic model as fedwan's
synthetic sites (same size, same paced steps), over the same emulated links.

Each writes a report in the shape of fedwan's (the server's like the
root's --report, a client's like a site's), so the harness summarises both
alike:

    python -m fedwan_bench.flower_node server --address 10.77.0.1:8080 --clients 4 \
        --rounds 5 --params 10000000 --report root-report.json
    python -m fedwan_bench.flower_node client --address 10.77.0.1:8080 --site 0 \
        --params 10000000 --inner-steps 10 --step-time-ms 50 --report site-0-report.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

LR = 0.1  # the synthetic trainer's step


def initial_model(params: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(params, dtype=np.float32) - 0.5) * 0.2


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def server(args: argparse.Namespace) -> int:
    import flwr as fl
    from flwr.server.strategy import FedAvg

    rounds: list[dict] = []
    opened: dict[int, float] = {}
    model_bytes = 4 * args.params

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            opened[server_round] = time.monotonic()
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            n = len(results)
            rounds.append({"round": server_round - 1,
                           "seconds": time.monotonic() - opened[server_round],
                           # fp32 both ways, as Flower sends it: the bytes the
                           # protocol puts on the links, before gRPC framing.
                           "wan_bytes": 2 * n * model_bytes, "fp32_bytes": 2 * n * model_bytes,
                           "frames": 2 * n, "weight": float(n)})
            return out

    strategy = TimedFedAvg(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=args.clients,
        min_evaluate_clients=0, min_available_clients=args.clients,
        initial_parameters=fl.common.ndarrays_to_parameters([initial_model(args.params,
                                                                           args.seed)]))
    fl.server.start_server(server_address=args.address,
                           config=fl.server.ServerConfig(num_rounds=args.rounds),
                           strategy=strategy)
    total = sum(r["wan_bytes"] for r in rounds)
    write_json(args.report, {"rounds": rounds, "wan_bytes_total": total,
                             "fp32_bytes_total": total, "security": "plaintext",
                             "system": f"flower {fl.__version__}"})
    return 0


def client(args: argparse.Namespace) -> int:
    import flwr as fl

    target = (np.random.default_rng(1000 + args.site).random(args.params, dtype=np.float32)
              - 0.5) * 2
    report: dict = {"node": f"site-{args.site}", "rounds": [], "step_time_ms": args.step_time_ms}
    state = {"synced_from": None, "round": 0, "joined": None}

    class Site(fl.client.NumPyClient):
        def get_parameters(self, config):
            return [np.zeros(args.params, dtype=np.float32)]

        def fit(self, parameters, config):
            now = time.time()
            if state["joined"] is None:
                state["joined"] = now
            elif state["synced_from"] is not None:
                # The previous round's upload, the server's wait for the
                # others and this round's download: the time a site waits.
                rows = report["rounds"]
                rows[-1]["sync_s"] = now - state["synced_from"]
            started = time.monotonic()
            p = parameters[0].astype(np.float32, copy=True)
            p -= LR * (p - target)  # one synthetic step per round, as fedwan's paced sites
            deadline = started + args.inner_steps * args.step_time_ms / 1e3
            while time.monotonic() < deadline:
                time.sleep(min(0.05, deadline - time.monotonic()))
            train_s = time.monotonic() - started
            state["synced_from"] = time.time()
            report["rounds"].append({"round": state["round"], "train_s": train_s, "sync_s": 0.0,
                                     "bytes_sent": 4 * args.params,
                                     "bytes_received": 4 * args.params, "bytes_resent": 0,
                                     "sync_start_unix": state["synced_from"]})
            state["round"] += 1
            return [p], 1, {}

    fl.client.start_client(server_address=args.address, client=Site().to_client(),
                           insecure=True, max_retries=60, max_wait_time=120)
    end = time.time()
    rows = report["rounds"]
    if rows and state["synced_from"] is not None:
        rows[-1]["sync_s"] = end - state["synced_from"]  # the last upload, until the server ends
    train = sum(r["train_s"] for r in rows)
    sync = sum(r["sync_s"] for r in rows)
    wall = end - state["joined"] if state["joined"] else 0.0
    report.update({"train_s_total": train, "sync_s_total": sync, "wall_s": wall,
                   "utilisation": train / wall if wall else 0.0,
                   "bytes_sent_total": sum(r["bytes_sent"] for r in rows),
                   "bytes_received_total": sum(r["bytes_received"] for r in rows),
                   "bytes_resent_total": 0, "stopped": False})
    write_json(args.report, report)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="Flower baseline nodes for fedwan bench")
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--address", required=True)
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--site", type=int, default=0)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--step-time-ms", type=float, default=50.0)
    args = ap.parse_args()
    return server(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    raise SystemExit(main())
