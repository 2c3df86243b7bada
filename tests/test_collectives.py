"""Every collective, dtype, reduce op and size at world sizes 1-4.

One spawn per world size runs all cases; each test then checks its slice of
the per-case outcomes. Every result is compared with a float64 (or exact)
reference computed locally and, where gloo supports the dtype, with the same
collective run on a gloo group over the same inputs.
"""

from __future__ import annotations

import functools
import time

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
from layouts import MEDIUM_NUMEL, ODD_NUMEL, SHAPES, TRANSPOSED_NUMEL, place
from reference import (
    DTYPES,
    REDUCE_OPS,
    all_inputs,
    assert_equal,
    assert_reduced,
    assert_same_as_gloo,
    gloo_supports,
    reduce_reference,
    seed_of,
    supported_ops,
)

WORLD_SIZES = (1, 2, 3, 4)
MEDIUM_DTYPES = ("float32", "float16", "bfloat16", "int8", "int64", "bool")


def _shapes(dtype_name: str) -> tuple[tuple[int, str], ...]:
    medium = ((MEDIUM_NUMEL, "contiguous"),) if dtype_name in MEDIUM_DTYPES else ()
    return SHAPES + medium


# --------------------------------------------------------------------------- rank side
#
# A check runs every collective (backend under test, then gloo) before it
# asserts anything: a rank that skipped a collective after a failed assertion
# would leave its peers waiting and turn one failure into a cascade of timeouts.


def _all_reduce(
    ctx: RankContext,
    ref: dist.ProcessGroup,
    dtype_name: str,
    layout: str,
    op: str,
    numel: int,
) -> Check:
    def check() -> None:
        dtype = DTYPES[dtype_name]
        world = ctx.world_size
        inputs = all_inputs(
            seed_of("all_reduce", dtype_name, layout, op, numel),
            world,
            numel,
            dtype,
            op,
        )
        placed = place(inputs[ctx.rank], layout)
        dist.all_reduce(placed.tensor, op=REDUCE_OPS[op])
        gloo = inputs[ctx.rank].clone()
        if gloo_supports(dtype):
            dist.all_reduce(gloo, op=REDUCE_OPS[op], group=ref)
        assert_reduced(
            placed.logical(), reduce_reference(inputs, op), op, world, "all_reduce"
        )
        placed.assert_gaps_untouched()
        if gloo_supports(dtype):
            assert_same_as_gloo(placed.logical(), gloo, op, world)

    return check


def _all_reduce_rejected(dtype_name: str, op: str) -> Check:
    """AVG is float-only and bitwise ops are integer-only: the call itself must fail, saying
    why, before anything is sent, and the group must still work afterwards."""
    why = (
        "ReduceOp.AVG needs a floating-point tensor"
        if op == "AVG"
        else "is a bitwise op and needs an integer or bool tensor"
    )

    def check() -> None:
        tensor = torch.ones(5, dtype=DTYPES[dtype_name])
        with pytest.raises(
            RuntimeError, match=f"allreduce on rank {dist.get_rank()}: .*{why}"
        ):
            dist.all_reduce(tensor, op=REDUCE_OPS[op])
        probe = torch.ones(5, dtype=torch.int32)
        dist.all_reduce(probe)
        assert torch.equal(
            probe, torch.full((5,), dist.get_world_size(), dtype=torch.int32)
        )

    return check


def _broadcast(
    ctx: RankContext,
    ref: dist.ProcessGroup,
    dtype_name: str,
    layout: str,
    root: int,
    numel: int,
) -> Check:
    def check() -> None:
        dtype = DTYPES[dtype_name]
        # The MAX value range spans the whole integer range, sign bit included.
        inputs = all_inputs(
            seed_of("broadcast", dtype_name, layout, root, numel),
            ctx.world_size,
            numel,
            dtype,
            "MAX",
        )
        placed = place(inputs[ctx.rank], layout)
        dist.broadcast(placed.tensor, src=root)
        gloo = inputs[ctx.rank].clone()
        if gloo_supports(dtype):
            dist.broadcast(gloo, src=root, group=ref)
        assert_equal(placed.logical(), inputs[root], f"broadcast from {root}")
        placed.assert_gaps_untouched()
        if gloo_supports(dtype):
            assert_equal(placed.logical(), gloo, "differs from gloo")

    return check


def _all_gather(
    ctx: RankContext, ref: dist.ProcessGroup, dtype_name: str, layout: str, numel: int
) -> Check:
    def check() -> None:
        dtype = DTYPES[dtype_name]
        world = ctx.world_size
        inputs = all_inputs(
            seed_of("all_gather", dtype_name, layout, numel), world, numel, dtype, "MAX"
        )
        placed = place(inputs[ctx.rank], layout)
        outputs = [place(torch.zeros(numel, dtype=dtype), layout) for _ in range(world)]
        dist.all_gather([out.tensor for out in outputs], placed.tensor)
        gloo = [torch.zeros(numel, dtype=dtype) for _ in range(world)]
        if gloo_supports(dtype):
            dist.all_gather(gloo, inputs[ctx.rank].clone(), group=ref)
        for src, out in enumerate(outputs):
            assert_equal(out.logical(), inputs[src], f"all_gather slot {src}")
            out.assert_gaps_untouched()
        assert_equal(placed.logical(), inputs[ctx.rank], "all_gather changed its input")
        if gloo_supports(dtype):
            for out, expected in zip(outputs, gloo, strict=True):
                assert_equal(out.logical(), expected, "differs from gloo")

    return check


def _all_gather_into_tensor(
    ctx: RankContext, ref: dist.ProcessGroup, dtype_name: str, numel: int
) -> Check:
    def check() -> None:
        dtype = DTYPES[dtype_name]
        world = ctx.world_size
        inputs = all_inputs(
            seed_of("all_gather_into_tensor", dtype_name, numel),
            world,
            numel,
            dtype,
            "MAX",
        )
        # Only the concatenated (W*n,) output form: gloo rejects the stacked one.
        shape = (world * numel,)
        output = torch.zeros(shape, dtype=dtype)
        dist.all_gather_into_tensor(output, inputs[ctx.rank].clone())
        gloo = torch.zeros(shape, dtype=dtype)
        if gloo_supports(dtype):
            dist.all_gather_into_tensor(gloo, inputs[ctx.rank].clone(), group=ref)
        assert_equal(output.reshape(-1), torch.cat(inputs), "all_gather_into_tensor")
        if gloo_supports(dtype):
            assert_equal(output, gloo, "differs from gloo")

    return check


# Tensors of one all_reduce_coalesced call: all contiguous, or each in another layout.
COALESCED_LISTS: dict[str, tuple[tuple[int, str], ...]] = {
    "contiguous": tuple(shape for shape in SHAPES if shape[1] == "contiguous"),
    "mixed": (
        (TRANSPOSED_NUMEL, "transposed"),
        (0, "contiguous"),
        (ODD_NUMEL, "strided"),
    ),
}


def _all_reduce_coalesced(
    ctx: RankContext, ref: dist.ProcessGroup, dtype_name: str, layouts: str, op: str
) -> Check:
    def check() -> None:
        dtype = DTYPES[dtype_name]
        world = ctx.world_size
        shapes = COALESCED_LISTS[layouts]
        inputs = [
            all_inputs(
                seed_of("coalesced", dtype_name, layouts, op, i),
                world,
                numel,
                dtype,
                op,
            )
            for i, (numel, _) in enumerate(shapes)
        ]
        placed = [
            place(per_rank[ctx.rank], layout)
            for per_rank, (_, layout) in zip(inputs, shapes, strict=True)
        ]
        dist.all_reduce_coalesced([p.tensor for p in placed], op=REDUCE_OPS[op])
        gloo = [per_rank[ctx.rank].clone() for per_rank in inputs]
        if gloo_supports(dtype):
            dist.all_reduce_coalesced(gloo, op=REDUCE_OPS[op], group=ref)
        for i, (per_rank, p) in enumerate(zip(inputs, placed, strict=True)):
            assert_reduced(
                p.logical(),
                reduce_reference(per_rank, op),
                op,
                world,
                f"all_reduce_coalesced tensor {i}",
            )
            p.assert_gaps_untouched()
            if gloo_supports(dtype):
                assert_same_as_gloo(p.logical(), gloo[i], op, world)

    return check


def _barrier(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    # Each round one rank arrives late; nobody may leave before it arrived.
    for late in range(ctx.world_size):
        if ctx.rank == late:
            time.sleep(0.3)
        arrived = time.time()
        dist.barrier()
        left = time.time()
        stamps: list[tuple[float, float] | None] = [None] * ctx.world_size
        dist.all_gather_object(stamps, (arrived, left), group=ref)
        last_arrival = max(s[0] for s in stamps if s is not None)
        assert left >= last_arrival, (
            f"rank {ctx.rank} left the barrier before rank {late} arrived"
        )


def _cases(ctx: RankContext, ref: dist.ProcessGroup) -> dict[str, Check]:
    cases: dict[str, Check] = {}
    for dtype_name, dtype in DTYPES.items():
        for op in REDUCE_OPS:
            if op not in supported_ops(dtype):
                cases[f"all_reduce_rejected/{dtype_name}/{op}"] = _all_reduce_rejected(
                    dtype_name, op
                )
        for numel, layout in _shapes(dtype_name):
            for op in supported_ops(dtype):
                cases[f"all_reduce/{dtype_name}/{layout}/{op}/n{numel}"] = _all_reduce(
                    ctx, ref, dtype_name, layout, op, numel
                )
            for root in range(ctx.world_size):
                cases[f"broadcast/{dtype_name}/{layout}/root{root}/n{numel}"] = (
                    _broadcast(ctx, ref, dtype_name, layout, root, numel)
                )
            cases[f"all_gather/{dtype_name}/{layout}/n{numel}"] = _all_gather(
                ctx, ref, dtype_name, layout, numel
            )
            if layout == "contiguous":
                cases[f"all_gather_into_tensor/{dtype_name}/n{numel}"] = (
                    _all_gather_into_tensor(ctx, ref, dtype_name, numel)
                )
        for layouts in COALESCED_LISTS:
            for op in supported_ops(dtype):
                cases[f"all_reduce_coalesced/{dtype_name}/{layouts}/{op}"] = (
                    _all_reduce_coalesced(ctx, ref, dtype_name, layouts, op)
                )
    cases["barrier/"] = functools.partial(_barrier, ctx, ref)
    return cases


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    ref = init_groups(ctx)
    return run_cases(_cases(ctx, ref))


# --------------------------------------------------------------------------- tests


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world, timeout_s=600)


WORLD = pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"w{w}")
DTYPE = pytest.mark.parametrize("dtype", list(DTYPES))
LAYOUT = pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])


@WORLD
@DTYPE
@LAYOUT
def test_all_reduce(world: int, dtype: str, layout: str) -> None:
    _report(world).assert_passed(f"all_reduce/{dtype}/{layout}/")


@WORLD
@DTYPE
def test_all_reduce_rejects_unsupported_op(world: int, dtype: str) -> None:
    _report(world).assert_passed(f"all_reduce_rejected/{dtype}/")


@WORLD
@DTYPE
@LAYOUT
def test_broadcast_from_every_root(world: int, dtype: str, layout: str) -> None:
    _report(world).assert_passed(f"broadcast/{dtype}/{layout}/")


@WORLD
@DTYPE
@LAYOUT
def test_all_gather(world: int, dtype: str, layout: str) -> None:
    _report(world).assert_passed(f"all_gather/{dtype}/{layout}/")


@WORLD
@DTYPE
def test_all_gather_into_tensor(world: int, dtype: str) -> None:
    _report(world).assert_passed(f"all_gather_into_tensor/{dtype}/")


@WORLD
@DTYPE
@pytest.mark.parametrize("layouts", list(COALESCED_LISTS))
def test_all_reduce_coalesced(world: int, dtype: str, layouts: str) -> None:
    _report(world).assert_passed(f"all_reduce_coalesced/{dtype}/{layouts}/")


@WORLD
def test_barrier_waits_for_the_last_rank(world: int) -> None:
    _report(world).assert_passed("barrier/")
