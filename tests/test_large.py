"""64 MiB float32 collectives at world sizes 2 and 3.

These span many transport chunks and many pipelined ring steps; they are the
expensive part of the suite, so only the three collectives DDP leans on run.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    Check,
    RankContext,
    init_groups,
    run_cases,
    spawn_cases,
)
from reference import (
    assert_equal,
    assert_reduced,
    assert_same_as_gloo,
    make_input,
    reduce_reference,
    seed_of,
)

pytestmark = pytest.mark.slow

WORLD_SIZES = (2, 3)
# 64 MiB of float32, plus a few elements so no ring segment is a round size.
NUMEL = (64 << 20) // 4 + 3


def _inputs(ctx: RankContext, name: str) -> list[torch.Tensor]:
    seed = seed_of("large", name)
    return [make_input(seed, r, NUMEL, torch.float32) for r in range(ctx.world_size)]


def _all_reduce(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    inputs = _inputs(ctx, "all_reduce")
    tensor = inputs[ctx.rank].clone()
    dist.all_reduce(tensor)
    gloo = inputs[ctx.rank].clone()
    dist.all_reduce(gloo, group=ref)
    expected = reduce_reference(inputs, "SUM")
    assert_reduced(tensor, expected, "SUM", ctx.world_size, "all_reduce")
    assert_same_as_gloo(tensor, gloo, "SUM", ctx.world_size)


def _broadcast(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    # The last rank as root: a root of 0 could hide an indexing bug.
    root = ctx.world_size - 1
    inputs = _inputs(ctx, "broadcast")
    tensor = inputs[ctx.rank].clone()
    dist.broadcast(tensor, src=root)
    gloo = inputs[ctx.rank].clone()
    dist.broadcast(gloo, src=root, group=ref)
    assert_equal(tensor, inputs[root], "broadcast")
    assert_equal(tensor, gloo, "differs from gloo")


def _all_gather(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    inputs = _inputs(ctx, "all_gather")
    outputs = [torch.empty(NUMEL) for _ in inputs]
    dist.all_gather(outputs, inputs[ctx.rank])
    gloo = [torch.empty(NUMEL) for _ in inputs]
    dist.all_gather(gloo, inputs[ctx.rank], group=ref)
    for src, out in enumerate(outputs):
        assert_equal(out, inputs[src], f"all_gather slot {src}")
        assert_equal(out, gloo[src], f"slot {src} differs from gloo")


def _cases(ctx: RankContext, ref: dist.ProcessGroup) -> dict[str, Check]:
    return {
        "all_reduce": functools.partial(_all_reduce, ctx, ref),
        "broadcast": functools.partial(_broadcast, ctx, ref),
        "all_gather": functools.partial(_all_gather, ctx, ref),
    }


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    ref = init_groups(ctx)
    return run_cases(_cases(ctx, ref))


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world, timeout_s=400)


WORLD = pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"w{w}")


@WORLD
def test_all_reduce_sum_64mib(world: int) -> None:
    _report(world).assert_passed("all_reduce")


@WORLD
def test_broadcast_64mib(world: int) -> None:
    _report(world).assert_passed("broadcast")


@WORLD
def test_all_gather_64mib(world: int) -> None:
    _report(world).assert_passed("all_gather")
