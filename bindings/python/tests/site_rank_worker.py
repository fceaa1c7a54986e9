"""One rank of a two-rank fedwan.Site under torch.distributed (gloo, CPU),
started by test_site_ranks.py with RANK and WORLD_SIZE set; the ranks meet
through a file (no port to collide with other tests).

usage: site_rank_worker.py TOPOLOGY NODE_ID CREDENTIALS OUT_DIR JOIN_TIMEOUT_S

A rank still running after 90 s prints every thread's stack and exits, so a
hang fails the test with its stack rather than a timeout.

Rank 0 uses CREDENTIALS; the other rank passes none (only the leader talks
to the federation). Writes OUT_DIR/rank<r>.npy (the final parameters) and
OUT_DIR/rank<r>.json (what the site reported), or OUT_DIR/rank<r>.error.
"""
import datetime
import faulthandler
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fedwan


def main():
    topology, node_id, creds, out_dir, join_timeout_s = sys.argv[1:6]
    faulthandler.dump_traceback_later(90, exit=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(7)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        with fedwan.Site(model, opt, topology=topology, node_id=node_id,
                         join_timeout_s=float(join_timeout_s),
                         credentials=creds if rank == 0 else None,
                         process_group=dist.group.WORLD) as site:
            ddp = DistributedDataParallel(model)
            # Each rank its own data; DDP averages the gradients.
            g = torch.Generator().manual_seed(100 + rank)
            x = torch.randn(16, 8, generator=g)
            y = torch.randn(16, 2, generator=g)
            steps, syncs = 0, 0
            while not site.finished:
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                steps += 1
                syncs += site.step() is not None
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), flat)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"steps": steps, "syncs": syncs, "round": site.round,
                       "leader": site.is_leader}, f)
    except Exception as e:  # reported to the test, which asserts on it
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
    finally:
        # Both ranks leave the group together: a rank tearing its Gloo
        # connections down while the other still uses them can abort or hang
        # the other's exit.
        dist.barrier()
        dist.destroy_process_group()
        # The results are written and the group is left: end here, before
        # this frame's objects (the DDP model, the site) are torn down. Under
        # load that teardown can hang on the process group's own threads
        # (seen in full test runs, after main() returned), which is not what
        # this test checks.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
