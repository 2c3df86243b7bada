"""Uneven all-to-all (single tensor and list forms), all_gather of tensors of
different sizes, and the coalesced collectives.

Expected values are built from every rank's inputs locally; where gloo offers
the same call, it runs too and must agree.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    RankContext,
    backend_under_test,
    init_groups,
    run_cases,
    spawn_cases,
)
from reference import assert_equal, assert_same_as_gloo, make_input, seed_of

COLUMNS = 3


def _splits(src: int, world: int) -> list[int]:
    """Rows rank ``src`` sends to each rank: uneven, with empty blocks."""
    return [(src * 2 + dst * 3) % 4 for dst in range(world)]


def _rows_for(src: int, dst: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    rows = _splits(src, world)[dst]
    values = make_input(seed_of("uneven", src, dst), src, rows * COLUMNS, dtype)
    return values.view(rows, COLUMNS)


def _all_to_all_single(
    ctx: RankContext, gloo: dist.ProcessGroup, dtype: torch.dtype
) -> None:
    world, me = ctx.world_size, ctx.rank
    send = torch.cat([_rows_for(me, dst, world, dtype) for dst in range(world)])
    recv_splits = [_splits(src, world)[me] for src in range(world)]
    expected = torch.cat([_rows_for(src, me, world, dtype) for src in range(world)])
    out = torch.full((sum(recv_splits), COLUMNS), 7, dtype=dtype)
    dist.all_to_all_single(out, send, recv_splits, _splits(me, world))
    assert_equal(out, expected, f"all_to_all_single {dtype}")
    if dtype in (torch.float32, torch.int64):  # what gloo's all-to-all handles
        ref = torch.empty_like(out)
        dist.all_to_all_single(ref, send, recv_splits, _splits(me, world), group=gloo)
        assert_equal(out, ref, "differs from gloo")


def _all_to_all_list(ctx: RankContext, dtype: torch.dtype) -> None:
    world, me = ctx.world_size, ctx.rank
    inputs = [_rows_for(me, dst, world, dtype) for dst in range(world)]
    outputs = [
        torch.zeros(_splits(src, world)[me], COLUMNS, dtype=dtype)
        for src in range(world)
    ]
    dist.all_to_all(outputs, inputs)
    for src in range(world):
        assert_equal(
            outputs[src], _rows_for(src, me, world, dtype), f"block from rank {src}"
        )


def _gather_rows(rank: int, world: int) -> int:
    """Rows rank ``rank`` contributes to the uneven all_gather: 2.4 MB (more than a
    chunk), none, and a few."""
    return (200_001, 0, 7)[rank % 3] if world > 1 else 5


def _gathered_block(rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    rows = _gather_rows(rank, world)
    values = make_input(seed_of("uneven gather", rank), rank, rows * COLUMNS, dtype)
    return values.view(rows, COLUMNS)


def _all_gather_uneven(ctx: RankContext, dtype: torch.dtype) -> None:
    # NCCL gathers tensors of different sizes; each output tensor gives its rank's.
    world, me = ctx.world_size, ctx.rank
    outputs = [
        torch.full((_gather_rows(r, world), COLUMNS), 7, dtype=dtype)
        for r in range(world)
    ]
    dist.all_gather(outputs, _gathered_block(me, world, dtype))
    for r in range(world):
        assert_equal(outputs[r], _gathered_block(r, world, dtype), f"block of rank {r}")


def _all_gather_coalesced(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # torch's layout: one list per rank, each with one tensor per input.
    world = ctx.world_size
    sizes = (5, 0, 1237)
    mine = [
        make_input(seed_of("agc", i), ctx.rank, n, torch.float32)
        for i, n in enumerate(sizes)
    ]
    outputs = [[torch.zeros(n) for n in sizes] for _ in range(world)]
    dist.all_gather_coalesced(outputs, mine)
    reference = [[torch.zeros(n) for n in sizes] for _ in range(world)]
    dist.all_gather_coalesced(reference, mine, group=gloo)
    for r in range(world):
        for i, n in enumerate(sizes):
            assert_equal(
                outputs[r][i],
                make_input(seed_of("agc", i), r, n, torch.float32),
                f"tensor {i} of rank {r}",
            )
            assert_equal(outputs[r][i], reference[r][i], "differs from gloo")


def _all_gather_coalesced_refuses_transposed(ctx: RankContext) -> None:
    # One list per input (outputs[i][r]) is refused at the call on every rank,
    # naming the op, the rank and the layout torch expects.
    world = ctx.world_size
    shapes = ((2, 2), (3,))
    mine = [torch.ones(shape) for shape in shapes]
    transposed = [[torch.zeros(shape) for _ in range(world)] for shape in shapes]
    expected = rf"allgather_coalesced on rank {ctx.rank}: " + (
        r"output tensor 1 for rank 0 is Float\[2, 2\] but input tensor 1 is Float\[3\]"
        if world == len(shapes)
        else rf"expected one list of output tensors per rank \({world}\), got 2 lists"
    )
    with pytest.raises(RuntimeError, match=expected):
        dist.all_gather_coalesced(transposed, mine)
    # The group is still usable.
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [float(world)] * 2


def _reduce_scatter_coalesced(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    world = ctx.world_size
    sizes = (4, 1237)
    inputs = [
        make_input(seed_of("rsc", i), ctx.rank, n * world, torch.float32)
        for i, n in enumerate(sizes)
    ]
    outputs = [torch.zeros(n) for n in sizes]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, inp in zip(outputs, inputs):
            dist.reduce_scatter_tensor(out, inp, async_op=True)
    manager.wait()
    for i, n in enumerate(sizes):
        ref = torch.zeros(n)
        dist.reduce_scatter_tensor(ref, inputs[i], group=gloo)
        local = sum(
            make_input(seed_of("rsc", i), r, n * world, torch.float32).double()
            for r in range(world)
        ).narrow(0, ctx.rank * n, n)
        torch.testing.assert_close(outputs[i].double(), local, rtol=1e-6, atol=1e-6)
        assert_same_as_gloo(outputs[i], ref, "SUM", world)


def _all_gather_into_tensor_coalesced(ctx: RankContext) -> None:
    world = ctx.world_size
    mine = [torch.full((n,), float(ctx.rank + n)) for n in (3, 8)]
    outputs = [torch.zeros(n * world) for n in (3, 8)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, inp in zip(outputs, mine):
            dist.all_gather_into_tensor(out, inp, async_op=True)
    manager.wait()
    for out, n in zip(outputs, (3, 8)):
        expected = torch.cat([torch.full((n,), float(r + n)) for r in range(world)])
        assert_equal(out, expected, f"{n} elements per rank")


def _coalescing_with_device(ctx: RankContext) -> None:
    # With a device, torch brackets the ops with startCoalescing/endCoalescing.
    tensors = [torch.full((4,), float(ctx.rank + i)) for i in range(3)]
    with dist._coalescing_manager(
        device=torch.device("cpu"), async_ops=True
    ) as manager:
        for t in tensors:
            dist.all_reduce(t)
    manager.wait()
    base = sum(range(ctx.world_size))
    for i, t in enumerate(tensors):
        assert t.tolist() == [float(base + i * ctx.world_size)] * 4, (i, t)


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    gloo = init_groups(ctx)
    cases = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        cases[f"single {dtype}"] = lambda d=dtype: _all_to_all_single(ctx, gloo, d)
        cases[f"list {dtype}"] = lambda d=dtype: _all_to_all_list(ctx, d)
        cases[f"all_gather uneven {dtype}"] = lambda d=dtype: _all_gather_uneven(ctx, d)
    cases["all_gather_coalesced"] = lambda: _all_gather_coalesced(ctx, gloo)
    if ctx.backend == "grpc":
        cases["transposed all_gather_coalesced"] = lambda: (
            _all_gather_coalesced_refuses_transposed(ctx)
        )
    cases["reduce_scatter coalesced"] = lambda: _reduce_scatter_coalesced(ctx, gloo)
    cases["all_gather_into_tensor coalesced"] = lambda: (
        _all_gather_into_tensor_coalesced(ctx)
    )
    cases["coalescing with device"] = lambda: _coalescing_with_device(ctx)
    outcomes = run_cases(cases)
    dist.destroy_process_group()
    return outcomes


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world)


WORLDS = [1, 2, 3]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_uneven_all_to_all_single(world: int, dtype: torch.dtype) -> None:
    _report(world).assert_passed(f"single {dtype}")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_uneven_all_to_all_list(world: int, dtype: torch.dtype) -> None:
    _report(world).assert_passed(f"list {dtype}")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_all_gather_of_different_sizes(world: int, dtype: torch.dtype) -> None:
    _report(world).assert_passed(f"all_gather uneven {dtype}")


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_coalesced(world: int) -> None:
    _report(world).assert_passed("all_gather_coalesced")


@pytest.mark.skipif(
    backend_under_test() != "grpc", reason="checks the grpc backend's message"
)
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_coalesced_refuses_one_list_per_input(world: int) -> None:
    _report(world).assert_passed("transposed all_gather_coalesced")


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_tensor_coalesced(world: int) -> None:
    _report(world).assert_passed("reduce_scatter coalesced")


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_into_tensor_coalesced(world: int) -> None:
    _report(world).assert_passed("all_gather_into_tensor coalesced")


@pytest.mark.parametrize("world", WORLDS)
def test_coalescing_manager_with_a_device(world: int) -> None:
    _report(world).assert_passed("coalescing with device")
