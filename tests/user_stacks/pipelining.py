"""torch.distributed.pipelining: one stage per rank, GPipe and 1F1B schedules.

Stages are built by hand (``PipelineStage``) or traced from the whole model
(``pipeline`` with split points, then ``build_stage``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    pipeline,
)

from dist_harness import RankContext
from user_stacks.common import FP32_TOL, FP64_TOL, assert_close, generator

WIDTH = 8
BATCH = 8
MICROBATCHES = 4
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_module(index: int) -> nn.Sequential:
    torch.manual_seed(500 + index)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(41)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(
        BATCH, WIDTH, generator=gen
    )


def build_stage(
    group: dist.ProcessGroup, rank: int, world: int, traced: bool
) -> PipelineStage:
    cpu = torch.device("cpu")
    if not traced:
        return PipelineStage(stage_module(rank), rank, world, cpu, group=group)
    whole = nn.Sequential(*(stage_module(i) for i in range(world)))
    pipe = pipeline(
        whole,
        mb_args=(data()[0].chunk(MICROBATCHES)[0],),
        split_spec={str(i): SplitPoint.BEGINNING for i in range(1, world)},
    )
    assert pipe.num_stages == world, pipe.num_stages
    return pipe.build_stage(rank, cpu, group)


def run_stage(
    group: dist.ProcessGroup, rank: int, world: int, schedule: str, traced: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One forward and backward of the whole batch; this stage's losses (last
    stage only) and parameter gradients, in parameter order."""
    stage = build_stage(group, rank, world, traced)
    sched = SCHEDULES[schedule](stage, n_microbatches=MICROBATCHES, loss_fn=F.mse_loss)
    x, y = data()
    losses: list[torch.Tensor] = []
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    grads = []
    for name, param in stage.submod.named_parameters():
        assert param.grad is not None, name
        grads.append(param.grad.detach().clone())
    return [loss.detach() for loss in losses], grads


def local_replay(
    world: int, rank: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The whole pipeline in one float64 model: per-microbatch losses, and the
    gradient of their mean (the schedules scale gradients by 1/MICROBATCHES)."""
    stages = [stage_module(i).double() for i in range(world)]
    model = nn.Sequential(*stages)
    x, y = data()
    losses = [
        F.mse_loss(model(xm.double()), ym.double())
        for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True)
    ]
    torch.stack(losses).mean().backward()
    grads = []
    for name, param in stages[rank].named_parameters():
        assert param.grad is not None, name
        grads.append(param.grad.detach())
    return [loss.detach() for loss in losses], grads


def check(
    ctx: RankContext, gloo: dist.ProcessGroup, schedule: str, traced: bool = False
) -> None:
    default = dist.group.WORLD
    assert default is not None
    world, rank = ctx.world_size, ctx.rank
    tested_losses, tested_grads = run_stage(default, rank, world, schedule, traced)
    gloo_losses, gloo_grads = run_stage(gloo, rank, world, schedule, traced)
    replay_losses, replay_grads = local_replay(world, rank)
    if rank == world - 1:
        assert len(tested_losses) == MICROBATCHES, len(tested_losses)
        for i, loss in enumerate(tested_losses):
            assert_close(loss, gloo_losses[i], f"loss {i} vs gloo", FP32_TOL)
            assert_close(loss, replay_losses[i], f"loss {i} vs replay", FP64_TOL)
    else:
        assert tested_losses == [], tested_losses
    assert len(tested_grads) == len(replay_grads) == 2, len(tested_grads)
    for i, grad in enumerate(tested_grads):
        assert grad.abs().max() > 1e-3, f"parameter {i}: gradient too small to compare"
        assert_close(grad, gloo_grads[i], f"parameter {i} grad vs gloo", FP32_TOL)
        assert_close(grad, replay_grads[i], f"parameter {i} grad vs replay", FP64_TOL)


def check_gpipe(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    check(ctx, gloo, "gpipe")


def check_1f1b(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    check(ctx, gloo, "1f1b")


def check_traced_gpipe(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    check(ctx, gloo, "gpipe", traced=True)
