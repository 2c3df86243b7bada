"""A short DDP training in float64, run by torchrun on each "host"; also its local replay.

    torchrun ... tests/two_hosts/ddp_train.py --backend grpc --out DIR

Every rank saves its trained parameters and its network namespace to DIR/BACKEND-rankR.pt.
Float64 keeps the summation order of each backend's allreduce out of the comparison: the
runs and the replay must agree to far below what a wrong gradient would change.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 10
LR = 0.05
BATCH = 8
# Half a MiB of gradients per step: more than one chunk for the backend, and far more
# traffic over the link than the rendezvous store's.
FEATURES, HIDDEN, OUTPUTS = 32, 256, 8


def initial_model(rank: int) -> nn.Module:
    # Different weights on every rank: DDP's initial broadcast from rank 0 must fix that.
    torch.manual_seed(1000 + rank)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, OUTPUTS),
    ).double()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(BATCH, FEATURES, generator=gen, dtype=torch.float64)
    return x, torch.randn(BATCH, OUTPUTS, generator=gen, dtype=torch.float64)


def local_replay(world: int) -> dict[str, torch.Tensor]:
    """Rank 0's initial model trained on every rank's batches in one process."""
    model = initial_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        # DDP averages the ranks' gradients: the gradient of the mean of their losses.
        loss = torch.stack(
            [F.mse_loss(model(x), y) for x, y in (batch(r, step) for r in range(world))]
        ).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(rank: int) -> dict[str, torch.Tensor]:
    model = DDP(initial_model(rank))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(rank, step)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.backend == "grpc":
        import torch_grpc_pg  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    params = train(rank)
    dist.barrier()
    dist.destroy_process_group()
    torch.save(
        {
            "rank": rank,
            "world": world,
            "netns": os.stat("/proc/self/ns/net").st_ino,
            "params": params,
        },
        args.out / f"{args.backend}-rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
