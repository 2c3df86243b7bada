"""async_op=True: many collectives in flight at once, and the Work/Future API.

DDP and user code issue several collectives before waiting on any of them;
each must still produce its own correct result, and the Work must report
completion, no exception, and a future whose value is the output tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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
from layouts import MEDIUM_NUMEL, ODD_NUMEL
from reference import (
    DTYPES,
    REDUCE_OPS,
    all_inputs,
    assert_equal,
    assert_reduced,
    reduce_reference,
    seed_of,
)

WORLD_SIZES = (2, 3)


@dataclass
class InFlight:
    name: str
    handle: Any  # a Work, or the Future that all_reduce_coalesced returns
    outputs: list[torch.Tensor]  # what the future's value must hold
    check: Callable[[], None]  # compares the outputs with the local reference


def _flat(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    else:
        for item in value:
            yield from _flat(item)


def _joined(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> torch.Tensor:
    # Backends may return all_gather_into_tensor's output whole or split per
    # rank (gloo does the latter); what must match is the data.
    return torch.cat([t.reshape(-1) for t in tensors])


def _issue_all_reduce(
    ctx: RankContext, dtype_name: str, op: str, numel: int
) -> InFlight:
    dtype = DTYPES[dtype_name]
    inputs = all_inputs(
        seed_of("async", dtype_name, op, numel), ctx.world_size, numel, dtype, op
    )
    tensor = inputs[ctx.rank].clone()
    work = dist.all_reduce(tensor, op=REDUCE_OPS[op], async_op=True)

    def check() -> None:
        expected = reduce_reference(inputs, op)
        assert_reduced(tensor, expected, op, ctx.world_size, "all_reduce")

    return InFlight(f"all_reduce {dtype_name} {op} n={numel}", work, [tensor], check)


def _issue_broadcast(ctx: RankContext, numel: int, root: int) -> InFlight:
    inputs = all_inputs(
        seed_of("async broadcast", numel), ctx.world_size, numel, torch.float64
    )
    tensor = inputs[ctx.rank].clone()
    work = dist.broadcast(tensor, src=root, async_op=True)
    return InFlight(
        f"broadcast n={numel} from {root}",
        work,
        [tensor],
        lambda: assert_equal(tensor, inputs[root], "broadcast"),
    )


def _issue_all_gather(ctx: RankContext, numel: int) -> InFlight:
    inputs = all_inputs(
        seed_of("async all_gather", numel), ctx.world_size, numel, torch.int32, "MAX"
    )
    outputs = [torch.zeros(numel, dtype=torch.int32) for _ in inputs]
    work = dist.all_gather(outputs, inputs[ctx.rank].clone(), async_op=True)
    return InFlight(
        f"all_gather n={numel}",
        work,
        outputs,
        lambda: assert_equal(_joined(outputs), _joined(inputs), "all_gather"),
    )


def _issue_all_gather_into_tensor(ctx: RankContext, numel: int) -> InFlight:
    inputs = all_inputs(
        seed_of("async into_tensor", numel), ctx.world_size, numel, torch.float16
    )
    output = torch.zeros(numel * ctx.world_size, dtype=torch.float16)
    work = dist.all_gather_into_tensor(output, inputs[ctx.rank].clone(), async_op=True)
    return InFlight(
        f"all_gather_into_tensor n={numel}",
        work,
        [output],
        lambda: assert_equal(output, torch.cat(inputs), "all_gather_into_tensor"),
    )


def _issue_all_reduce_coalesced(ctx: RankContext) -> InFlight:
    numels = (ODD_NUMEL, 1, 0, MEDIUM_NUMEL)
    inputs = [
        all_inputs(seed_of("async coalesced", n), ctx.world_size, n, torch.float32)
        for n in numels
    ]
    tensors = [per_rank[ctx.rank].clone() for per_rank in inputs]
    # all_reduce_coalesced(async_op=True) hands back a Future, not a Work.
    future = dist.all_reduce_coalesced(tensors, async_op=True)

    def check() -> None:
        for per_rank, tensor in zip(inputs, tensors, strict=True):
            expected = reduce_reference(per_rank, "SUM")
            assert_reduced(
                tensor, expected, "SUM", ctx.world_size, "all_reduce_coalesced"
            )

    return InFlight("all_reduce_coalesced", future, tensors, check)


def _many_in_flight(ctx: RankContext) -> None:
    ops = [
        _issue_all_reduce(ctx, "float32", "SUM", ODD_NUMEL),
        _issue_all_reduce(ctx, "int64", "MAX", MEDIUM_NUMEL),
        _issue_broadcast(ctx, ODD_NUMEL, root=ctx.world_size - 1),
        _issue_all_reduce(ctx, "bfloat16", "AVG", MEDIUM_NUMEL),
        _issue_all_gather(ctx, ODD_NUMEL),
        _issue_all_gather_into_tensor(ctx, MEDIUM_NUMEL),
        _issue_all_reduce_coalesced(ctx),
        _issue_all_reduce(ctx, "float32", "PRODUCT", 1),
        _issue_all_reduce(ctx, "uint8", "BXOR", 0),
    ]
    # Waiting newest-first: completing a later op must not depend on anyone
    # having waited for an earlier one.
    barrier = dist.barrier(async_op=True)
    assert barrier is not None
    barrier.wait()
    assert barrier.is_completed()
    failures = []
    for inflight in reversed(ops):
        try:
            _wait_and_check(inflight)
        except AssertionError as exc:
            failures.append(f"{inflight.name}: {exc}")
    assert not failures, "\n".join(failures)


def _wait_and_check(inflight: InFlight) -> None:
    handle = inflight.handle
    if isinstance(handle, torch._C.Future):
        value = handle.wait()
        assert handle.done()
    else:
        handle.wait()
        assert handle.is_completed(), "is_completed() is False after wait()"
        assert handle.exception() is None, f"exception() is {handle.exception()!r}"
        value = handle.get_future().wait()
    assert_equal(
        _joined(_flat(value)), _joined(inflight.outputs), "future value vs outputs"
    )
    inflight.check()


def _future_then(ctx: RankContext) -> None:
    # DDP's comm hooks chain work on the future: the callback must see the result.
    tensor = torch.full((ODD_NUMEL,), float(ctx.rank + 1))
    work = dist.all_reduce(tensor, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2).wait()
    total = sum(range(1, ctx.world_size + 1))
    assert_equal(doubled, torch.full((ODD_NUMEL,), 2.0 * total), "then() result")


def _fifty_small(ctx: RankContext) -> None:
    tensors = [torch.tensor([i, ctx.rank, i * ctx.rank]) for i in range(50)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in works:
        work.wait()
    ranks = sum(range(ctx.world_size))
    for i, tensor in enumerate(tensors):
        expected = torch.tensor([i * ctx.world_size, ranks, i * ranks])
        assert_equal(tensor, expected, f"op {i}")


def _sync_between_async(ctx: RankContext) -> None:
    big = _issue_all_reduce(ctx, "float64", "SUM", MEDIUM_NUMEL)
    small = torch.tensor([float(ctx.rank)])
    dist.all_reduce(small)
    assert_equal(small, torch.tensor([float(sum(range(ctx.world_size)))]), "sync op")
    _wait_and_check(big)


def _cases(ctx: RankContext) -> dict[str, Check]:
    return {
        name: functools.partial(check, ctx)
        for name, check in {
            "many_in_flight": _many_in_flight,
            "future_then": _future_then,
            "fifty_small": _fifty_small,
            "sync_between_async": _sync_between_async,
        }.items()
    }


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    init_groups(ctx)
    return run_cases(_cases(ctx))


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world, timeout_s=300)


WORLD = pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"w{w}")


@WORLD
def test_many_ops_in_flight_then_wait_all(world: int) -> None:
    _report(world).assert_passed("many_in_flight")


@WORLD
def test_future_then_sees_the_result(world: int) -> None:
    _report(world).assert_passed("future_then")


@WORLD
def test_fifty_small_async_ops(world: int) -> None:
    _report(world).assert_passed("fifty_small")


@WORLD
def test_sync_op_while_async_op_in_flight(world: int) -> None:
    _report(world).assert_passed("sync_between_async")
