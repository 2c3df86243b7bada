"""ZeroRedundancyOptimizer under DistributedDataParallel."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_harness import RankContext
from user_stacks.common import (
    FP32_TOL,
    FP64_TOL,
    assert_all_close,
    assert_moved,
    generator,
)

STEPS = 4
LR = 0.1
MOMENTUM = 0.9


def initial_model(rank: int) -> nn.Sequential:
    # Different weights per rank: DDP's broadcast from rank 0 must align them.
    torch.manual_seed(900 + rank)
    return nn.Sequential(
        nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 2)
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(61, rank, step)
    return torch.randn(5, 6, generator=gen), torch.randn(5, 2, generator=gen)


def train(group: dist.ProcessGroup, rank: int, world: int) -> dict[str, torch.Tensor]:
    ddp = DDP(initial_model(rank), process_group=group)
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=torch.optim.SGD,
        process_group=group,
        lr=LR,
        momentum=MOMENTUM,
    )
    owned = sum(len(g["params"]) for g in opt.optim.param_groups)
    total = len(list(ddp.parameters()))
    assert 0 < owned < total, f"rank {rank} updates {owned} of {total} parameters"
    for step in range(STEPS):
        x, y = batch(rank, step)
        F.mse_loss(ddp(x), y).backward()
        opt.step()  # updates this rank's shard, then broadcasts every shard
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in ddp.module.named_parameters()}


def local_replay(world: int) -> dict[str, torch.Tensor]:
    model = initial_model(0).double()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        losses = []
        for rank in range(world):
            x, y = batch(rank, step)
            losses.append(F.mse_loss(model(x.double()), y.double()))
        torch.stack(losses).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in model.named_parameters()}


def check(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    default = dist.group.WORLD
    assert default is not None
    tested = train(default, ctx.rank, ctx.world_size)
    assert_all_close(tested, train(gloo, ctx.rank, ctx.world_size), "vs gloo", FP32_TOL)
    replay = local_replay(ctx.world_size)
    assert_all_close(tested, replay, "vs float64 replay", FP64_TOL)
    initial = {k: v.detach() for k, v in initial_model(0).named_parameters()}
    assert_moved(replay, initial, 100 * FP64_TOL["atol"])
