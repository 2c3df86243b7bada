"""Subgroups, concurrent disjoint groups, destroy, re-init, and every init method."""

from __future__ import annotations

import functools
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    LOOPBACK,
    CaseReport,
    Check,
    RankContext,
    init_groups,
    run_cases,
    run_ranks,
    spawn_cases,
    store_barrier,
)
from layouts import MEDIUM_NUMEL, ODD_NUMEL
from reference import (
    all_inputs,
    assert_equal,
    assert_reduced,
    assert_same_as_gloo,
    reduce_reference,
    seed_of,
)

# destroy_process_group() must not wait on anything remote.
PROMPT_DESTROY_S = 5.0


def _inputs(ctx: RankContext, name: str, numel: int = ODD_NUMEL) -> list[torch.Tensor]:
    return all_inputs(seed_of("groups", name), ctx.world_size, numel, torch.float32)


def _pair(
    ctx: RankContext, ranks: list[int]
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """The same ranks as a group of the backend under test and as a gloo group."""
    group = dist.new_group(ranks=ranks, backend=ctx.backend)
    gloo = dist.new_group(ranks=ranks, backend="gloo")
    return group, gloo


# --------------------------------------------------------------------------- world 3: subgroups


def _all_reduce_excluding_rank2(ctx: RankContext) -> None:
    members = [0, 1]
    group, gloo = _pair(ctx, members)
    inputs = _inputs(ctx, "exclude 2")
    tensor = inputs[ctx.rank].clone()
    gloo_tensor = inputs[ctx.rank].clone()
    # A non-member's call is a no-op in torch; it must not reach any backend.
    dist.all_reduce(tensor, group=group)
    dist.all_reduce(gloo_tensor, group=gloo)
    if ctx.rank in members:
        assert dist.get_world_size(group) == 2
        assert dist.get_rank(group) == members.index(ctx.rank)
        expected = reduce_reference([inputs[r] for r in members], "SUM")
        assert_reduced(tensor, expected, "SUM", 2, "subgroup all_reduce")
        assert_same_as_gloo(tensor, gloo_tensor, "SUM", 2)
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        assert_equal(tensor, inputs[ctx.rank], "non-member's tensor")


def _broadcast_and_gather_excluding_rank0(ctx: RankContext) -> None:
    members = [1, 2]
    group, gloo = _pair(ctx, members)
    inputs = _inputs(ctx, "exclude 0", MEDIUM_NUMEL)
    bcast = inputs[ctx.rank].clone()
    gathered = [torch.zeros(MEDIUM_NUMEL) for _ in members]
    gloo_gathered = [torch.zeros(MEDIUM_NUMEL) for _ in members]
    if ctx.rank in members:
        # src is a global rank: 2 is group rank 1.
        dist.broadcast(bcast, src=2, group=group)
        dist.all_gather(gathered, inputs[ctx.rank], group=group)
        dist.all_gather(gloo_gathered, inputs[ctx.rank], group=gloo)
        assert_equal(bcast, inputs[2], "subgroup broadcast")
        for slot, member in enumerate(members):
            assert_equal(gathered[slot], inputs[member], f"slot {slot}")
            assert_equal(gathered[slot], gloo_gathered[slot], "differs from gloo")


def _singleton_group(ctx: RankContext) -> None:
    group = dist.new_group(ranks=[2], backend=ctx.backend)
    if ctx.rank == 2:
        inputs = _inputs(ctx, "singleton")
        tensor = inputs[2].clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        dist.broadcast(tensor, src=2, group=group)
        out = [torch.zeros(ODD_NUMEL)]
        dist.all_gather(out, tensor, group=group)
        dist.barrier(group=group)
        assert_equal(tensor, inputs[2], "one-rank all_reduce/broadcast")
        assert_equal(out[0], inputs[2], "one-rank all_gather")


def _interleaved_groups(ctx: RankContext) -> None:
    # Rank 1 belongs to both pairs; ops must land in the group they were issued on.
    g01 = dist.new_group(ranks=[0, 1], backend=ctx.backend)
    g12 = dist.new_group(ranks=[1, 2], backend=ctx.backend)
    world = _inputs(ctx, "interleaved world")
    pair01 = _inputs(ctx, "interleaved 01")
    pair12 = _inputs(ctx, "interleaved 12")
    t_world = world[ctx.rank].clone()
    t01 = pair01[ctx.rank].clone()
    t12 = pair12[ctx.rank].clone()
    works = [dist.all_reduce(t_world, async_op=True)]
    if ctx.rank in (0, 1):
        works.append(dist.all_reduce(t01, group=g01, async_op=True))
    if ctx.rank in (1, 2):
        works.append(dist.all_reduce(t12, group=g12, async_op=True))
    for work in works:
        assert work is not None
        work.wait()
    assert_reduced(t_world, reduce_reference(world, "SUM"), "SUM", 3, "default")
    if ctx.rank in (0, 1):
        assert_reduced(t01, reduce_reference(pair01[:2], "SUM"), "SUM", 2, "g01")
    if ctx.rank in (1, 2):
        assert_reduced(t12, reduce_reference(pair12[1:], "SUM"), "SUM", 2, "g12")


def _destroy_subgroup_then_recreate(ctx: RankContext) -> None:
    members = [0, 1]
    group = dist.new_group(ranks=members, backend=ctx.backend)
    destroy_s = 0.0
    if ctx.rank in members:
        dist.all_reduce(torch.ones(3), group=group)
        started = time.monotonic()
        dist.destroy_process_group(group)
        destroy_s = time.monotonic() - started
    again = dist.new_group(ranks=members, backend=ctx.backend)
    inputs = _inputs(ctx, "recreated")
    tensor = inputs[ctx.rank].clone()
    world = inputs[ctx.rank].clone()
    if ctx.rank in members:
        dist.all_reduce(tensor, group=again)
    dist.all_reduce(world)
    assert destroy_s < PROMPT_DESTROY_S, f"destroying a subgroup took {destroy_s:.1f}s"
    if ctx.rank in members:
        expected = reduce_reference(inputs[:2], "SUM")
        assert_reduced(tensor, expected, "SUM", 2, "recreated group")
    assert_reduced(world, reduce_reference(inputs, "SUM"), "SUM", 3, "default group")


def _subgroup_rank_main(ctx: RankContext) -> dict[str, str | None]:
    init_groups(ctx)
    cases: dict[str, Check] = {
        name: functools.partial(fn, ctx)
        for name, fn in {
            "exclude_rank2": _all_reduce_excluding_rank2,
            "exclude_rank0": _broadcast_and_gather_excluding_rank0,
            "singleton": _singleton_group,
            "interleaved": _interleaved_groups,
            "destroy_subgroup": _destroy_subgroup_then_recreate,
        }.items()
    }
    return run_cases(cases)


def _subgroups() -> CaseReport:
    return spawn_cases(_subgroup_rank_main, 3)


def test_all_reduce_in_group_that_excludes_a_rank() -> None:
    _subgroups().assert_passed("exclude_rank2")


def test_broadcast_and_all_gather_in_group_without_rank0() -> None:
    _subgroups().assert_passed("exclude_rank0")


def test_single_rank_subgroup() -> None:
    _subgroups().assert_passed("singleton")


def test_overlapping_groups_interleaved() -> None:
    _subgroups().assert_passed("interleaved")


def test_destroy_subgroup_then_create_it_again() -> None:
    _subgroups().assert_passed("destroy_subgroup")


# --------------------------------------------------------------------------- world 4: disjoint pairs


def _disjoint_pairs_rank_main(ctx: RankContext) -> None:
    init_groups(ctx)
    pairs = [[0, 2], [1, 3]]
    groups = [dist.new_group(ranks=p, backend=ctx.backend) for p in pairs]
    mine = next(i for i, p in enumerate(pairs) if ctx.rank in p)
    group, members = groups[mine], pairs[mine]
    per_op = [_inputs(ctx, f"pairs {mine} {i}", MEDIUM_NUMEL) for i in range(5)]
    tensors = [inputs[ctx.rank].clone() for inputs in per_op]
    # Both pairs run at the same time, with world-wide ops in between.
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    world = torch.tensor([float(ctx.rank)])
    dist.all_reduce(world)
    for work in works:
        work.wait()
    assert world.item() == sum(range(ctx.world_size))
    for i, (inputs, tensor) in enumerate(zip(per_op, tensors, strict=True)):
        expected = reduce_reference([inputs[r] for r in members], "SUM")
        assert_reduced(tensor, expected, "SUM", 2, f"pair {members} op {i}")


def test_disjoint_groups_run_concurrently() -> None:
    run_ranks(_disjoint_pairs_rank_main, 4)


# --------------------------------------------------------------------------- init methods, re-init


def _init(ctx: RankContext, method: str, port: int, attempt: int) -> None:
    timeout = timedelta(seconds=60)
    if method == "store":
        init_groups(ctx)
        return
    # Line ranks up first: rank 0 must be listening before the others give up.
    store_barrier(ctx.store(), ctx.world_size, f"before {method} {attempt}")
    if method == "env":
        os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
        try:
            dist.init_process_group(
                ctx.backend,
                init_method="env://",
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=timeout,
            )
        finally:
            del os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    elif method == "tcp":
        dist.init_process_group(
            ctx.backend,
            init_method=f"tcp://{LOOPBACK}:{port}",
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timeout,
        )
    elif method == "file":
        dist.init_process_group(
            ctx.backend,
            init_method=f"file://{ctx.tmp_dir}/rendezvous-{attempt}",
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timeout,
        )
    else:
        raise ValueError(method)


INIT_METHODS = ("store", "env", "tcp", "file", "store_again")


def _reinit_rank_main(ctx: RankContext) -> dict[str, str | None]:
    def one_life(method: str, attempt: int) -> None:
        port = ctx.spare_ports[attempt]
        _init(ctx, method.removesuffix("_again"), port, attempt)
        assert dist.get_backend() == ctx.backend
        inputs = _inputs(ctx, f"life {attempt}", MEDIUM_NUMEL)
        tensor = inputs[ctx.rank].clone()
        dist.all_reduce(tensor)
        sub = dist.new_group(backend=ctx.backend)
        flag = torch.tensor([ctx.rank + attempt])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=sub)
        started = time.monotonic()
        dist.destroy_process_group()
        destroy_s = time.monotonic() - started
        assert not dist.is_initialized()
        expected = reduce_reference(inputs, "SUM")
        assert_reduced(tensor, expected, "SUM", ctx.world_size, method)
        assert flag.item() == ctx.world_size - 1 + attempt
        assert destroy_s < PROMPT_DESTROY_S, f"destroy took {destroy_s:.1f}s"

    cases: dict[str, Check] = {
        method: functools.partial(one_life, method, attempt)
        for attempt, method in enumerate(INIT_METHODS)
    }
    return run_cases(cases)


def _reinit() -> CaseReport:
    return spawn_cases(_reinit_rank_main, 2, spare_ports=len(INIT_METHODS))


@pytest.mark.parametrize("method", INIT_METHODS)
def test_init_use_destroy_then_init_again(method: str) -> None:
    """Each init method in turn, in the same processes, each after a destroy."""
    _reinit().assert_passed(method)
