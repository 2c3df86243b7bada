"""The collectives under test: tensors, the call, and a check of its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from _args import DTYPES

if TYPE_CHECKING:
    from _spawn import RankContext

OPS = ("allreduce", "broadcast", "allgather", "barrier")


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    # Bytes actually moved: the tensor for allreduce/broadcast, the whole output for
    # allgather.
    nbytes: int
    world: int
    backend: str


def actual_bytes(op: str, dtype: str, requested: int, world: int) -> int:
    """Round a requested size to whole elements (whole per-rank chunks for allgather)."""
    if op == "barrier":
        return 0
    item = torch.empty((), dtype=DTYPES[dtype]).element_size()
    if op == "allgather":
        return max(1, requested // (item * world)) * item * world
    return max(1, requested // item) * item


@dataclass
class CollectiveOp:
    run: Callable[[], object]
    fill: Callable[[], object]  # checkable values
    check: Callable[[], bool]
    reset: Callable[
        [], object
    ]  # zeros for timing: sums never overflow or hit slow denormals


def _all_equal(t: torch.Tensor, value: float) -> bool:
    # Through min and max rather than `(t == value).all()`: a tensor-sized temporary,
    # mapped and unmapped, would raise glibc's malloc thresholds in the ranks, and so
    # change how the transports' own buffers are served from then on. A plain script
    # that only calls the collective does not do that.
    if t.numel() == 0:
        return True
    return t.min().item() == value and t.max().item() == value


def make_op(
    case: Case, group: dist.ProcessGroup, rank: int, world: int, device: torch.device
) -> CollectiveOp:
    """The op on `group`, with tensors on `device`, ready to check and to time."""
    if case.op == "barrier":
        return CollectiveOp(
            lambda: dist.barrier(group=group), lambda: None, lambda: True, lambda: None
        )
    dtype = DTYPES[case.dtype]
    item = torch.empty((), dtype=dtype).element_size()
    if case.op == "allgather":
        chunk = case.nbytes // item // world
        inp = torch.empty(chunk, dtype=dtype, device=device)
        out = torch.empty(chunk * world, dtype=dtype, device=device)

        def fill() -> None:
            inp.fill_(rank + 1)
            out.zero_()

        def check() -> bool:
            return all(
                _all_equal(part, r + 1) for r, part in enumerate(out.view(world, chunk))
            )

        def reset() -> None:
            inp.zero_()
            out.zero_()

        return CollectiveOp(
            lambda: dist.all_gather_into_tensor(out, inp, group=group),
            fill,
            check,
            reset,
        )
    t = torch.empty(case.nbytes // item, dtype=dtype, device=device)
    if case.op == "allreduce":
        return CollectiveOp(
            lambda: dist.all_reduce(t, group=group),
            lambda: t.fill_(rank + 1),
            lambda: _all_equal(t, world * (world + 1) // 2),
            t.zero_,
        )
    if case.op == "broadcast":
        return CollectiveOp(
            lambda: dist.broadcast(t, src=0, group=group),
            lambda: t.fill_(3 if rank == 0 else 0),
            lambda: _all_equal(t, 3),
            t.zero_,
        )
    raise ValueError(f"unknown op {case.op}")


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw / algbw."""
    if op == "allreduce":
        return 2 * (world - 1) / world
    if op == "allgather":
        return (world - 1) / world
    return 1.0


def ready_on_default_group(ctx: RankContext, case: Case, warmup: int) -> CollectiveOp:
    """The case's op on the default group: checked on every rank, reset, warmed up."""
    op = make_op(case, dist.group.WORLD, ctx.rank, ctx.world, ctx.device)
    op.fill()
    op.run()
    if not ctx.agree(op.check()):
        raise RuntimeError(f"{case.backend} {case.op} {case.nbytes} B: wrong result")
    op.reset()
    for _ in range(warmup):
        op.run()
    return op
