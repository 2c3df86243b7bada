"""gloo as the oracle: every public call of torch.distributed that gloo supports,
run on the same inputs under gloo and under the backend under test, in the same ranks.

Each case is one function of the side it runs on (the default group, which
runs the backend under test, or a gloo group over the same ranks) that makes
its inputs, calls torch.distributed and returns what the call produced:
output tensors, objects, source ranks. Both sides' results must be equal
exactly. Inputs are small integers in every dtype, so that every reduction is
exact in any order and precision, and the worlds are 2 and 3, where the
per-rank and per-tensor axes of the list arguments have different lengths
(2 tensors per rank, 3 ranks): a backend that reads one for the other fails.

Where grpc differs from gloo on purpose, the case says so and compares with
the gloo calls that define the same result:

* ``reduce`` leaves the non-root ranks' tensors as they were (as NCCL does);
  gloo leaves partial sums there. Only the root's tensor is compared.
* AVG and PREMUL_SUM, which gloo refuses: gloo's SUM divided by the world
  size, and gloo's SUM of the premultiplied inputs.
* ``all_gather`` of tensors of different sizes, which gloo refuses: each
  rank's block is what gloo broadcasts from that rank.
* ``all_to_all`` of blocks of different sizes, which gloo's list form
  refuses: gloo's ``all_to_all_single`` of the blocks, concatenated.
* ``all_gather_into_tensor`` into an output whose first dim is the rank
  (world, n), which NCCL takes and gloo refuses: gloo's flat output, viewed so.
* ``monitored_barrier``, which torch's Python runs only for gloo: it refuses
  the call for grpc with its own message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    REFERENCE_BACKEND,
    CaseReport,
    RankContext,
    backend_under_test,
    init_groups,
    run_cases,
    spawn_cases,
)
from reference import seed_of

WORLDS = (2, 3)
TENSORS_PER_RANK = 2  # differs from every world size used
# Every dtype gloo reduces (torch 2.13: not int16 and no unsigned but uint8).
REDUCE_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
MOVE_DTYPES = {name: REDUCE_DTYPES[name] for name in ("float32", "int64", "bool")}
FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
PLAIN_OPS = ("SUM", "PRODUCT", "MIN", "MAX")
BITWISE_OPS = ("BAND", "BOR", "BXOR")
GLOO_REFUSES = (
    "AVG",
    "PREMUL_SUM",
)  # compared with gloo's SUM, see the module docstring
PREMUL_FACTOR = 2.0  # exact in every float dtype


def _ops(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype in FLOAT_DTYPES:
        return PLAIN_OPS + GLOO_REFUSES
    return PLAIN_OPS + BITWISE_OPS


@dataclass(frozen=True)
class Side:
    """Where a call runs: the default group (the backend under test) or gloo."""

    backend: str
    group: dist.ProcessGroup | None  # None: the default group
    rank: int
    world: int


Call = Callable[[Side], Any]


# --------------------------------------------------------------------------- inputs


def _values(
    what: str, rank: int, shape: tuple[int, ...], dtype: torch.dtype, op: str = "SUM"
) -> torch.Tensor:
    """Small integers, the same on both sides: sums and products of up to 3 are exact."""
    gen = torch.Generator().manual_seed(seed_of(what, rank, dtype, op))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    low, high = (-3, 4) if op == "PRODUCT" else (-8, 9)
    if dtype == torch.uint8:
        low = 0
    return torch.randint(low, high, shape, generator=gen).to(dtype)


def _reduce_op(op: str) -> dist.ReduceOp:
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def _with_gloo_op(
    side: Side, op: str, tensor: torch.Tensor
) -> tuple[torch.Tensor, str]:
    """The input and op to run on ``side`` for ``op``: gloo runs AVG and PREMUL_SUM as SUM."""
    if side.backend == REFERENCE_BACKEND and op == "PREMUL_SUM":
        return tensor * PREMUL_FACTOR, "SUM"
    if side.backend == REFERENCE_BACKEND and op == "AVG":
        return tensor, "SUM"
    return tensor, op


def _finish_gloo_op(side: Side, op: str, result: torch.Tensor) -> torch.Tensor:
    if side.backend == REFERENCE_BACKEND and op == "AVG":
        return result.div_(side.world)
    return result


# --------------------------------------------------------------------------- comparison


def assert_identical(ours: Any, gloo: Any, where: str = "result") -> None:
    """Equal structure, dtypes, shapes and values; tensors compared exactly."""
    if isinstance(ours, torch.Tensor):
        assert isinstance(gloo, torch.Tensor), (where, type(gloo))
        assert ours.dtype == gloo.dtype, (
            f"{where}: dtype {ours.dtype} vs gloo's {gloo.dtype}"
        )
        assert ours.shape == gloo.shape, (
            f"{where}: shape {ours.shape} vs gloo's {gloo.shape}"
        )
        torch.testing.assert_close(
            ours, gloo, rtol=0, atol=0, msg=lambda m: f"{where} differs from gloo: {m}"
        )
    elif isinstance(ours, (list, tuple)):
        assert isinstance(gloo, (list, tuple)), (where, type(gloo))
        assert len(ours) == len(gloo), (
            f"{where}: {len(ours)} items vs gloo's {len(gloo)}"
        )
        for i, (a, b) in enumerate(zip(ours, gloo)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(ours, dict):
        assert isinstance(gloo, dict) and ours.keys() == gloo.keys(), (
            where,
            ours,
            gloo,
        )
        for key in ours:
            assert_identical(ours[key], gloo[key], f"{where}[{key!r}]")
    else:
        assert ours == gloo, f"{where}: {ours!r} vs gloo's {gloo!r}"


def _same_as_gloo(ctx: RankContext, gloo: dist.ProcessGroup, call: Call) -> None:
    # Both calls run before anything is asserted: a rank that stopped after a
    # failed assertion would leave its peers waiting in the next call.
    ours = call(Side(ctx.backend, None, ctx.rank, ctx.world_size))
    theirs = call(Side(REFERENCE_BACKEND, gloo, ctx.rank, ctx.world_size))
    assert_identical(ours, theirs)


# --------------------------------------------------------------------------- reductions


def _all_reduce(op: str, dtype: torch.dtype, side: Side) -> torch.Tensor:
    tensor, run_op = _with_gloo_op(
        side, op, _values("all_reduce", side.rank, (3, 5), dtype, op)
    )
    dist.all_reduce(tensor, op=_reduce_op(run_op), group=side.group)
    return _finish_gloo_op(side, op, tensor)


def _reduce(op: str, dtype: torch.dtype, root: int, side: Side) -> torch.Tensor | None:
    mine = _values("reduce", side.rank, (7,), dtype, op)
    tensor, run_op = _with_gloo_op(side, op, mine.clone())
    dist.reduce(tensor, dst=root, op=_reduce_op(run_op), group=side.group)
    if side.rank != root:
        # On purpose: grpc, as NCCL, leaves a non-root rank's tensor as it was;
        # gloo leaves partial results in it.
        if side.backend == "grpc":
            assert torch.equal(tensor, mine), (
                f"reduce changed rank {side.rank}'s tensor"
            )
        return None
    return _finish_gloo_op(side, op, tensor)


def _reduce_scatter(op: str, dtype: torch.dtype, side: Side) -> torch.Tensor:
    # The list form: input i goes to rank i.
    inputs = [
        _with_gloo_op(
            side, op, _values(f"reduce_scatter{i}", side.rank, (2, 3), dtype, op)
        )[0]
        for i in range(side.world)
    ]
    _, run_op = _with_gloo_op(side, op, inputs[0])
    output = torch.zeros(2, 3, dtype=dtype)
    dist.reduce_scatter(output, inputs, op=_reduce_op(run_op), group=side.group)
    return _finish_gloo_op(side, op, output)


def _reduce_scatter_tensor(op: str, dtype: torch.dtype, side: Side) -> torch.Tensor:
    full, run_op = _with_gloo_op(
        side,
        op,
        _values("reduce_scatter_tensor", side.rank, (side.world * 4,), dtype, op),
    )
    output = torch.zeros(4, dtype=dtype)
    dist.reduce_scatter_tensor(output, full, op=_reduce_op(run_op), group=side.group)
    return _finish_gloo_op(side, op, output)


def _all_reduce_coalesced(
    op: str, dtype: torch.dtype, side: Side
) -> list[torch.Tensor]:
    shapes = [(3,), (2, 2), (0,), (5,)]
    tensors = []
    run_op = op
    for i, shape in enumerate(shapes):
        tensor, run_op = _with_gloo_op(
            side, op, _values(f"coalesced{i}", side.rank, shape, dtype, op)
        )
        tensors.append(tensor)
    dist.all_reduce_coalesced(tensors, op=_reduce_op(run_op), group=side.group)
    return [_finish_gloo_op(side, op, t) for t in tensors]


def _coalescing_manager_all_reduce(
    op: str, dtype: torch.dtype, side: Side
) -> list[torch.Tensor]:
    pairs = [
        _with_gloo_op(side, op, _values(f"manager{i}", side.rank, (4 + i,), dtype, op))
        for i in range(3)
    ]
    with dist._coalescing_manager(group=side.group, async_ops=True) as manager:
        for tensor, run_op in pairs:
            dist.all_reduce(
                tensor, op=_reduce_op(run_op), group=side.group, async_op=True
            )
    manager.wait()
    return [_finish_gloo_op(side, op, tensor) for tensor, _ in pairs]


def _coalescing_manager_reduce_scatter(
    op: str, dtype: torch.dtype, side: Side
) -> list[torch.Tensor]:
    outputs = [torch.zeros(n, dtype=dtype) for n in (2, 3)]
    inputs = []
    run_op = op
    for i, out in enumerate(outputs):
        tensor, run_op = _with_gloo_op(
            side,
            op,
            _values(
                f"manager_rs{i}", side.rank, (side.world * out.numel(),), dtype, op
            ),
        )
        inputs.append(tensor)
    with dist._coalescing_manager(group=side.group, async_ops=True) as manager:
        for out, inp in zip(outputs, inputs):
            dist.reduce_scatter_tensor(
                out, inp, op=_reduce_op(run_op), group=side.group, async_op=True
            )
    manager.wait()
    return [_finish_gloo_op(side, op, out) for out in outputs]


# --------------------------------------------------------------------------- data movement


def _broadcast(dtype: torch.dtype, root: int, side: Side) -> torch.Tensor:
    tensor = _values("broadcast", side.rank, (4, 3), dtype)
    dist.broadcast(tensor, src=root, group=side.group)
    return tensor


def _all_gather(dtype: torch.dtype, side: Side) -> list[torch.Tensor]:
    outputs = [torch.zeros(2, 3, dtype=dtype) for _ in range(side.world)]
    dist.all_gather(
        outputs, _values("all_gather", side.rank, (2, 3), dtype), group=side.group
    )
    return outputs


def _all_gather_into_tensor(dtype: torch.dtype, side: Side) -> list[torch.Tensor]:
    mine = _values("all_gather_into_tensor", side.rank, (5,), dtype)
    flat = torch.zeros(side.world * 5, dtype=dtype)
    dist.all_gather_into_tensor(flat, mine, group=side.group)
    # The output's first dim may be the rank, as NCCL takes it; gloo refuses
    # that shape, so its side gathers flat and views the result so.
    stacked = torch.zeros(side.world, 5, dtype=dtype)
    if side.backend == REFERENCE_BACKEND:
        dist.all_gather_into_tensor(stacked.view(-1), mine, group=side.group)
    else:
        dist.all_gather_into_tensor(stacked, mine, group=side.group)
    single = torch.zeros(side.world * 5, dtype=dtype)
    dist.all_gather_single(single, mine, group=side.group)
    return [flat, stacked, single]


def _all_gather_coalesced(dtype: torch.dtype, side: Side) -> list[list[torch.Tensor]]:
    # torch's layout: output_tensor_lists[rank][i] receives input i of that rank.
    shapes = [(2, 2), (3,)][:TENSORS_PER_RANK]
    inputs = [
        _values(f"agc{i}", side.rank, shape, dtype) for i, shape in enumerate(shapes)
    ]
    outputs = [
        [torch.zeros(shape, dtype=dtype) for shape in shapes] for _ in range(side.world)
    ]
    dist.all_gather_coalesced(outputs, inputs, group=side.group)
    return outputs


def _coalescing_manager_all_gather(
    dtype: torch.dtype, side: Side
) -> list[torch.Tensor]:
    inputs = [
        _values(f"manager_ag{i}", side.rank, (2 + i,), dtype)
        for i in range(TENSORS_PER_RANK)
    ]
    outputs = [torch.zeros(side.world * t.numel(), dtype=dtype) for t in inputs]
    with dist._coalescing_manager(group=side.group, async_ops=True) as manager:
        for out, inp in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, inp, group=side.group, async_op=True)
    manager.wait()
    return outputs


def _gather(dtype: torch.dtype, root: int, side: Side) -> list[torch.Tensor] | None:
    outputs = (
        [torch.zeros(3, dtype=dtype) for _ in range(side.world)]
        if side.rank == root
        else None
    )
    dist.gather(
        _values("gather", side.rank, (3,), dtype), outputs, dst=root, group=side.group
    )
    return outputs


def _scatter(dtype: torch.dtype, root: int, side: Side) -> torch.Tensor:
    inputs = (
        [_values(f"scatter{r}", root, (2, 2), dtype) for r in range(side.world)]
        if side.rank == root
        else None
    )
    output = torch.zeros(2, 2, dtype=dtype)
    dist.scatter(output, inputs, src=root, group=side.group)
    return output


def _all_to_all(dtype: torch.dtype, uneven: bool, side: Side) -> list[torch.Tensor]:
    def rows(src: int, dst: int) -> int:
        return (src + 2 * dst) % 3 + 1 if uneven else 2

    inputs = [
        _values(f"all_to_all{dst}", side.rank, (rows(side.rank, dst), 3), dtype)
        for dst in range(side.world)
    ]
    outputs = [
        torch.zeros(rows(src, side.rank), 3, dtype=dtype) for src in range(side.world)
    ]
    if uneven and side.backend == REFERENCE_BACKEND:
        # gloo's list form refuses blocks of different sizes; its single-tensor
        # form takes them, as row splits of the concatenation.
        received = torch.cat(outputs)
        dist.all_to_all_single(
            received,
            torch.cat(inputs),
            [t.shape[0] for t in outputs],
            [t.shape[0] for t in inputs],
            group=side.group,
        )
        return list(received.split([t.shape[0] for t in outputs]))
    dist.all_to_all(outputs, inputs, group=side.group)
    return outputs


def _all_to_all_single(dtype: torch.dtype, uneven: bool, side: Side) -> torch.Tensor:
    def rows(src: int, dst: int) -> int:
        return (2 * src + dst) % 3 if uneven else 2  # uneven: some blocks are empty

    send = [rows(side.rank, dst) for dst in range(side.world)]
    recv = [rows(src, side.rank) for src in range(side.world)]
    inputs = _values("all_to_all_single", side.rank, (sum(send), 2), dtype)
    output = torch.zeros(sum(recv), 2, dtype=dtype)
    if uneven:
        dist.all_to_all_single(output, inputs, recv, send, group=side.group)
    else:
        dist.all_to_all_single(output, inputs, group=side.group)
    return output


def _barrier(side: Side) -> Any:
    return dist.barrier(group=side.group)


# --------------------------------------------------------------------------- objects


def _object(rank: int, salt: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "salt": salt,
        "payload": list(range(rank + 2)),
        "text": "x" * rank,
    }


def _all_gather_object(side: Side) -> list[Any]:
    gathered: list[Any] = [None] * side.world
    dist.all_gather_object(gathered, _object(side.rank, "all_gather"), group=side.group)
    return gathered


def _gather_object(root: int, side: Side) -> list[Any] | None:
    gathered = [None] * side.world if side.rank == root else None
    dist.gather_object(
        _object(side.rank, "gather"), gathered, dst=root, group=side.group
    )
    return gathered


def _broadcast_object_list(root: int, side: Side) -> list[Any]:
    objects = [_object(side.rank, "broadcast"), side.rank * 10, f"from {side.rank}"]
    dist.broadcast_object_list(objects, src=root, group=side.group)
    return objects


def _scatter_object_list(root: int, side: Side) -> list[Any]:
    scattered: list[Any] = [None]
    objects = (
        [_object(r, "scatter") for r in range(side.world)]
        if side.rank == root
        else None
    )
    dist.scatter_object_list(scattered, objects, src=root, group=side.group)
    return scattered


def _send_recv_object_list(side: Side) -> list[Any] | None:
    # Rank 0 sends to the last rank.
    last = side.world - 1
    if side.rank == 0:
        dist.send_object_list([_object(0, "p2p"), "second"], dst=last, group=side.group)
        return None
    if side.rank == last:
        received: list[Any] = [None, None]
        dist.recv_object_list(received, src=0, group=side.group)
        return received
    return None


# --------------------------------------------------------------------------- point to point


def _send_recv(dtype: torch.dtype, side: Side) -> list[Any]:
    # Each rank sends to the next and receives from the previous, with a tag,
    # ordered so that no two blocking calls wait for each other.
    nxt, prev = (side.rank + 1) % side.world, (side.rank - 1) % side.world
    mine = _values("send", side.rank, (6,), dtype)
    received = torch.zeros(6, dtype=dtype)
    if side.rank % 2 == 0:
        dist.send(mine, dst=nxt, group=side.group, tag=7)
        dist.recv(received, src=prev, group=side.group, tag=7)
    else:
        dist.recv(received, src=prev, group=side.group, tag=7)
        dist.send(mine, dst=nxt, group=side.group, tag=7)
    return [received]


def _isend_irecv(dtype: torch.dtype, side: Side) -> list[torch.Tensor]:
    nxt, prev = (side.rank + 1) % side.world, (side.rank - 1) % side.world
    received = torch.zeros(4, dtype=dtype)
    works = [
        dist.irecv(received, src=prev, group=side.group),
        dist.isend(_values("isend", side.rank, (4,), dtype), dst=nxt, group=side.group),
    ]
    for work in works:
        work.wait()
    return [received]


def _batch_isend_irecv(dtype: torch.dtype, side: Side) -> list[torch.Tensor]:
    nxt, prev = (side.rank + 1) % side.world, (side.rank - 1) % side.world
    received = [torch.zeros(3, dtype=dtype), torch.zeros(5, dtype=dtype)]
    ops = [
        dist.P2POp(
            dist.isend, _values("batch0", side.rank, (3,), dtype), nxt, side.group, 1
        ),
        dist.P2POp(
            dist.isend, _values("batch1", side.rank, (5,), dtype), nxt, side.group, 2
        ),
        dist.P2POp(dist.irecv, received[0], prev, side.group, 1),
        dist.P2POp(dist.irecv, received[1], prev, side.group, 2),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


def _recv_any_source(side: Side) -> list[Any] | None:
    # Only the last rank sends, so the sender that recv() returns is known.
    last = side.world - 1
    if side.rank == last:
        dist.send(_values("any", last, (3,), torch.float32), dst=0, group=side.group)
    if side.rank == 0:
        received = torch.zeros(3)
        sender = dist.recv(received, group=side.group)
        return [sender, received]
    return None


# --------------------------------------------------------------------------- subgroups


def _subgroup_calls(sub: dist.ProcessGroup | None, side: Side) -> list[Any]:
    """A run of calls in the group of ranks 0 and world-1, roots given as global ranks."""
    members = [0, side.world - 1]
    if side.rank not in members:
        return []
    last = members[-1]
    results: list[Any] = []
    tensor = _values("sub_all_reduce", side.rank, (5,), torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=sub)
    results.append(tensor)
    tensor = _values("sub_broadcast", side.rank, (3,), torch.float32)
    dist.broadcast(tensor, src=last, group=sub)
    results.append(tensor)
    gathered = [torch.zeros(2) for _ in members] if side.rank == last else None
    dist.gather(
        _values("sub_gather", side.rank, (2,), torch.float32),
        gathered,
        dst=last,
        group=sub,
    )
    results.append(gathered)
    outputs = [[torch.zeros(2, 2), torch.zeros(3)] for _ in members]
    inputs = [
        _values("sub_agc0", side.rank, (2, 2), torch.float32),
        _values("sub_agc1", side.rank, (3,), torch.float32),
    ]
    dist.all_gather_coalesced(outputs, inputs, group=sub)
    results.append(outputs)
    out = torch.zeros(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(
        out, _values("sub_rs", side.rank, (4,), torch.int32), group=sub
    )
    results.append(out)
    received = torch.zeros(4)
    if side.rank == 0:
        dist.send(_values("sub_send", 0, (4,), torch.float32), dst=last, group=sub)
    else:
        dist.recv(received, src=0, group=sub)
    results.append(received)
    return results


# --------------------------------------------------------------------------- cases


def _cases(ctx: RankContext, gloo: dist.ProcessGroup) -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}

    def add(name: str, call: Call) -> None:
        cases[name] = functools.partial(_same_as_gloo, ctx, gloo, call)

    roots = range(ctx.world_size)
    for dname, dtype in REDUCE_DTYPES.items():
        for op in _ops(dtype):
            bind = functools.partial
            add(f"all_reduce/{dname}/{op}", bind(_all_reduce, op, dtype))
            for root in roots:
                add(f"reduce/{dname}/{op}/root{root}", bind(_reduce, op, dtype, root))
            add(f"reduce_scatter/{dname}/{op}", bind(_reduce_scatter, op, dtype))
            add(
                f"reduce_scatter_tensor/{dname}/{op}",
                bind(_reduce_scatter_tensor, op, dtype),
            )
            add(
                f"all_reduce_coalesced/{dname}/{op}",
                bind(_all_reduce_coalesced, op, dtype),
            )
            add(
                f"coalescing_manager_all_reduce/{dname}/{op}",
                bind(_coalescing_manager_all_reduce, op, dtype),
            )
            add(
                f"coalescing_manager_reduce_scatter/{dname}/{op}",
                bind(_coalescing_manager_reduce_scatter, op, dtype),
            )
    for dname, dtype in MOVE_DTYPES.items():
        bind = functools.partial
        for root in roots:
            add(f"broadcast/{dname}/root{root}", bind(_broadcast, dtype, root))
            add(f"gather/{dname}/root{root}", bind(_gather, dtype, root))
            add(f"scatter/{dname}/root{root}", bind(_scatter, dtype, root))
        add(f"all_gather/{dname}", bind(_all_gather, dtype))
        add(f"all_gather_into_tensor/{dname}", bind(_all_gather_into_tensor, dtype))
        add(f"all_gather_coalesced/{dname}", bind(_all_gather_coalesced, dtype))
        add(
            f"coalescing_manager_all_gather/{dname}",
            bind(_coalescing_manager_all_gather, dtype),
        )
        for uneven in (False, True):
            kind = "uneven" if uneven else "even"
            add(f"all_to_all/{dname}/{kind}", bind(_all_to_all, dtype, uneven))
            add(
                f"all_to_all_single/{dname}/{kind}",
                bind(_all_to_all_single, dtype, uneven),
            )
        add(f"send_recv/{dname}", bind(_send_recv, dtype))
        add(f"isend_irecv/{dname}", bind(_isend_irecv, dtype))
        add(f"batch_isend_irecv/{dname}", bind(_batch_isend_irecv, dtype))
    add("barrier", _barrier)
    add("recv_any_source", _recv_any_source)
    add("all_gather_object", _all_gather_object)
    for root in roots:
        add(f"gather_object/root{root}", functools.partial(_gather_object, root))
        add(
            f"broadcast_object_list/root{root}",
            functools.partial(_broadcast_object_list, root),
        )
        add(
            f"scatter_object_list/root{root}",
            functools.partial(_scatter_object_list, root),
        )
    add("send_recv_object_list", _send_recv_object_list)
    return cases


# --------------------------------------------------------------------------- cases apart


def _subgroups(ctx: RankContext, ours: Any, theirs: Any) -> None:
    """The same calls in a subgroup of each backend (ranks 0 and world-1)."""
    side = Side(ctx.backend, None, ctx.rank, ctx.world_size)
    gloo_side = Side(REFERENCE_BACKEND, None, ctx.rank, ctx.world_size)
    assert_identical(_subgroup_calls(ours, side), _subgroup_calls(theirs, gloo_side))


def _enumerated_subgroups(ctx: RankContext, ours: Any, theirs: Any) -> None:
    results = []
    for group in (ours, theirs):
        tensor = _values("enumerated", ctx.rank, (4,), torch.int64)
        dist.all_reduce(tensor, group=group)
        gathered = [torch.zeros(4, dtype=torch.int64) for _ in range(group.size())]
        dist.all_gather(gathered, tensor, group=group)
        results.append([tensor, gathered, group.rank(), group.size()])
    assert_identical(results[0], results[1])


def _uneven_all_gather(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # gloo refuses output tensors of different sizes; each rank's block must be
    # what gloo broadcasts from that rank.
    def rows(rank: int) -> int:
        return (rank * 2) % 3  # rank 0 sends nothing

    mine = _values("uneven_all_gather", ctx.rank, (rows(ctx.rank), 2), torch.float32)
    outputs = [torch.zeros(rows(r), 2) for r in range(ctx.world_size)]
    dist.all_gather(outputs, mine)
    expected = []
    for r in range(ctx.world_size):
        block = mine.clone() if r == ctx.rank else torch.zeros(rows(r), 2)
        dist.broadcast(block, src=r, group=gloo)
        expected.append(block)
    assert_identical(outputs, expected)


def _monitored_barrier(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    dist.monitored_barrier(group=gloo)
    if ctx.backend == REFERENCE_BACKEND:
        dist.monitored_barrier()
        return
    # torch's Python runs monitored_barrier for gloo only, whatever the backend can do.
    with pytest.raises(ValueError, match="only implemented for GLOO"):
        dist.monitored_barrier()


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    gloo = init_groups(ctx)
    members = [0, ctx.world_size - 1]
    sub_ours = dist.new_group(members)
    sub_gloo = dist.new_group(members, backend=REFERENCE_BACKEND)
    layout = [members, [r for r in range(ctx.world_size) if r not in members]]
    layout = [ranks for ranks in layout if ranks]
    enum_ours, _ = dist.new_subgroups_by_enumeration(layout)
    enum_gloo, _ = dist.new_subgroups_by_enumeration(layout, backend=REFERENCE_BACKEND)
    cases = _cases(ctx, gloo)
    cases["subgroup"] = functools.partial(_subgroups, ctx, sub_ours, sub_gloo)
    cases["new_subgroups_by_enumeration"] = functools.partial(
        _enumerated_subgroups, ctx, enum_ours, enum_gloo
    )
    if ctx.backend != REFERENCE_BACKEND:  # gloo itself refuses it
        cases["all_gather uneven"] = functools.partial(_uneven_all_gather, ctx, gloo)
    cases["monitored_barrier"] = functools.partial(_monitored_barrier, ctx, gloo)
    outcomes = run_cases(cases)
    dist.destroy_process_group()
    return outcomes


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world)


REDUCTIONS = (
    "all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_reduce_coalesced",
    "coalescing_manager_all_reduce",
    "coalescing_manager_reduce_scatter",
)
MOVES = (
    "broadcast",
    "gather",
    "scatter",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "coalescing_manager_all_gather",
    "all_to_all",
    "all_to_all_single",
    "send_recv",
    "isend_irecv",
    "batch_isend_irecv",
)
OTHERS = (
    "barrier",
    "recv_any_source",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_recv_object_list",
    "subgroup",
    "new_subgroups_by_enumeration",
    "all_gather uneven",
    "monitored_barrier",
)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(REDUCE_DTYPES))
@pytest.mark.parametrize("call", REDUCTIONS)
def test_reductions_match_gloo(world: int, call: str, dtype: str) -> None:
    _report(world).assert_passed(f"{call}/{dtype}/")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(MOVE_DTYPES))
@pytest.mark.parametrize("call", MOVES)
def test_data_movement_matches_gloo(world: int, call: str, dtype: str) -> None:
    _report(world).assert_passed(f"{call}/{dtype}")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("call", OTHERS)
def test_call_matches_gloo(world: int, call: str) -> None:
    if call == "all_gather uneven" and backend_under_test() == REFERENCE_BACKEND:
        pytest.skip("gloo refuses an all_gather of tensors of different sizes")
    _report(world).assert_passed(call)


def test_every_case_is_reported() -> None:
    # A case that no test selects would run unseen.
    report = _report(WORLDS[-1])
    prefixes = (
        [f"{c}/{d}/" for c in REDUCTIONS for d in REDUCE_DTYPES]
        + [f"{c}/{d}" for c in MOVES for d in MOVE_DTYPES]
        + list(OTHERS)
    )
    unseen = [name for name in report.outcomes if not name.startswith(tuple(prefixes))]
    assert not unseen, unseen
