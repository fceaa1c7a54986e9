#!/usr/bin/env python3
"""Fashion-MNIST with PyTorch, made federated by fedwan.

An ordinary training script. The lines marked ``# fedwan`` are all it takes
to federate it: the model trains on this site's own data, and every H steps
(the topology's inner_steps) fedwan exchanges its progress with the other
sites through the aggregators and loads the federation's model.

One process per site::

    python3 train_fashion.py --topology federation.yaml --site site-0 \
        --credentials pki/site-0

A site of several ranks (DDP inside the site; rank 0 talks to the
federation, the others receive the model over the site's process group)::

    torchrun --nproc_per_node 2 train_fashion.py --topology federation.yaml \
        --site site-0 --credentials pki/site-0

launch.py starts a whole federation of these on this machine.
"""
import argparse
import datetime
import gc
import gzip
import os
import struct

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import fedwan  # fedwan


class Net(nn.Module):
    """A small CNN (about 12k parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, padding=2)
        self.conv2 = nn.Conv2d(8, 16, 5, padding=2)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def initial_model(seed):
    """The model every node starts from (launch.py gives it to the root)."""
    torch.manual_seed(seed)
    return Net()


def load_fashion_mnist(data_dir, split):
    """(images [N,1,28,28] float in [0,1], labels [N] int64) of 'train' or 't10k'."""
    def read(name, magic):
        with gzip.open(os.path.join(data_dir, name), "rb") as f:
            data = f.read()
        if struct.unpack(">I", data[:4])[0] != magic:
            raise SystemExit(f"{name}: not an idx file (install dataset-fashion-mnist)")
        return data
    images = read(f"{split}-images-idx3-ubyte.gz", 2051)
    labels = read(f"{split}-labels-idx1-ubyte.gz", 2049)
    n = struct.unpack(">I", images[4:8])[0]
    x = np.frombuffer(images, dtype=np.uint8, offset=16).reshape(n, 1, 28, 28)
    y = np.frombuffer(labels, dtype=np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def site_shard(labels, site, sites, seed):
    """This site's private data, simulated: a label-skewed split of the
    training set (each site sees mostly some classes)."""
    g = np.random.default_rng(seed)
    weights = g.dirichlet([0.5] * sites, size=10)  # per class: the share of each site
    rows = []
    for c in range(10):
        idx = np.flatnonzero(labels.numpy() == c)
        g.shuffle(idx)
        cuts = (np.cumsum(weights[c])[:-1] * len(idx)).astype(int)
        rows.append(np.split(idx, cuts)[site])
    return torch.from_numpy(np.sort(np.concatenate(rows)))


def evaluate(model, images, labels):
    model.eval()
    with torch.no_grad():
        correct = sum((model(images[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum().item()
                      for i in range(0, len(labels), 1000))
    model.train()
    return correct / len(labels)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", required=True)
    # (not --node: torchrun would take it for an abbreviation of its --node-rank)
    ap.add_argument("--site", required=True, help="this site's id in the topology")
    ap.add_argument("--credentials", help="this site's bundle directory (rank 0 only needs it)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-samples", type=int, default=0, help="cap this site's data (0: all)")
    ap.add_argument("--eval-samples", type=int, default=10000)
    ap.add_argument("--save", help="write each rank's final parameters to SAVE.rank<r>.npy")
    args = ap.parse_args()
    torch.set_num_threads(1)

    # A site of several ranks when started by torchrun.
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    topology = fedwan.Topology.load(args.topology)                            # fedwan
    sites = [n.id for n in topology.nodes if n.role == "site"]
    images, labels = load_fashion_mnist(args.data, "train")
    rows = site_shard(labels, sites.index(args.site), len(sites), args.seed)
    if args.max_samples:
        rows = rows[:args.max_samples]
    rows = rows[rank::world]  # this rank's part of the site's data
    images, labels = images[rows], labels[rows]

    model = initial_model(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    site = fedwan.Site(model, optimizer, topology=topology, node_id=args.site,  # fedwan
                       credentials=args.credentials if rank == 0 else None,     # fedwan
                       process_group=dist.group.WORLD if distributed else None)  # fedwan
    with site:                                                                # fedwan
        net = DistributedDataParallel(model) if distributed else model
        g = torch.Generator().manual_seed(args.seed * 1000 + rank)
        while not site.finished:                                              # fedwan
            for batch in torch.randperm(len(labels), generator=g).split(args.batch_size):
                loss = F.cross_entropy(net(images[batch]), labels[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if site.step() is not None and rank == 0:                     # fedwan
                    print(f"{args.site}: round {site.round} loss {loss.item():.4f}",
                          flush=True)
                if site.finished:                                             # fedwan
                    break

    if args.save:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
        np.save(f"{args.save}.rank{rank}.npy", flat)
    if rank == 0:
        test_x, test_y = load_fashion_mnist(args.data, "t10k")
        n = min(args.eval_samples, len(test_y))
        print(f"{args.site}: final accuracy {evaluate(model, test_x[:n], test_y[:n]):.4f} "
              f"on {n} test images", flush=True)
    if distributed:
        # The DDP wrapper goes before the group it holds: torn down after
        # destroy_process_group (at exit), it aborted a rank now and then
        # under Gloo ("terminate called without an active exception").
        del net
        gc.collect()
        dist.barrier()  # leave the group together, then tear it down
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
