"""A blocking collective runs on the calling thread; an async one is queued.

A call with ``async_op=False`` on a host tensor whose group has nothing queued runs where it
is called (csrc/backend/op_queue.h, run_here_if_idle), whether it goes through the group's
shared segment (every rank on one host) or over gRPC links (here TCP, as between hosts):
two thread hand-offs fewer, most of a small op's time. Every test runs both ways. These
tests hold it to what a caller of torch.distributed relies on:

- an async call still returns before its peers have arrived, a blocking one after;
- calls run in the order they were issued on every rank, whichever of them were async, and
  give what gloo gives on the same inputs (the oracle);
- a blocking call that waits for a late peer lets other Python threads run (the GIL is
  released), fails naming a peer that died, and ends when another thread aborts the group.

A peer is made late on purpose, by far more than a call's own time, so that "returned
before the peer arrived" and "returned after" cannot be confused on a loaded machine.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from dist_harness import (
    RankContext,
    backend_under_test,
    init_default_group,
    init_groups,
    run_ranks,
    store_barrier,
)

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="the grpc backend's calling-thread path"
)


@pytest.fixture(autouse=True, params=["segment", "tcp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared segment, or TCP links (no unix sockets, so no rings and no segment)."""
    if request.param == "tcp":
        monkeypatch.setenv("TORCH_GRPC_PG_UNIX_SOCKETS", "0")
    return str(request.param)


LATE_S = 1.5  # how late the peer comes; far above a call's own time
OP_TIMEOUT = timedelta(seconds=60)


def _options(kind: type, async_op: bool) -> Any:
    opts = kind()
    opts.asyncOp = async_op
    return opts


def _calls(
    group: dist.ProcessGroup, rank: int, world: int
) -> dict[str, Callable[[bool], Any]]:
    """Each collective that may run on the calling thread, issued on the group with asyncOp set."""
    n = 1024

    def allreduce(async_op: bool) -> Any:
        return group.allreduce(
            [torch.full((n,), rank + 1.0)], _options(c10d.AllreduceOptions, async_op)
        )

    def broadcast(async_op: bool) -> Any:
        opts = _options(c10d.BroadcastOptions, async_op)
        opts.rootRank = world - 1
        return group.broadcast([torch.full((n,), float(rank))], opts)

    def all_gather_into_tensor(async_op: bool) -> Any:
        out = torch.empty(n * world)
        return group._allgather_base(
            out,
            torch.full((n,), float(rank)),
            _options(c10d.AllgatherOptions, async_op),
        )

    def reduce_scatter_tensor(async_op: bool) -> Any:
        out = torch.empty(n)
        opts = _options(c10d.ReduceScatterOptions, async_op)
        return group._reduce_scatter_base(out, torch.ones(n * world), opts)

    def barrier(async_op: bool) -> Any:
        return group.barrier(_options(c10d.BarrierOptions, async_op))

    return {
        "allreduce": allreduce,
        "broadcast": broadcast,
        "all_gather_into_tensor": all_gather_into_tensor,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "barrier": barrier,
    }


# --------------------------------------------------------------------------- where it runs


def _returns_when(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    group = dist.group.WORLD
    seen: dict[str, Any] = {}
    for name, call in _calls(group, ctx.rank, ctx.world_size).items():
        for async_op in (False, True):
            key = f"{name} async={async_op}"
            store_barrier(store, ctx.world_size, f"before {key}")
            if ctx.rank != 0:
                time.sleep(LATE_S)
            started = time.monotonic()
            work = call(async_op)
            returned_s = time.monotonic() - started
            done_at_return = work.is_completed()
            work.wait()
            seen[key] = (returned_s, done_at_return)
    return seen


def test_a_blocking_call_returns_done_and_an_async_one_returns_at_once() -> None:
    rank0 = run_ranks(_returns_when, 2, timeout_s=180)[0].value
    for key, (returned_s, done_at_return) in rank0.items():
        if key.endswith("async=False"):
            # Ran here: it could only return once the late peer had come.
            assert done_at_return and returned_s > LATE_S / 2, (key, returned_s)
        else:
            assert not done_at_return and returned_s < LATE_S / 2, (key, returned_s)


# --------------------------------------------------------------------------- order


def _mixed_order(ctx: RankContext) -> list[str]:
    gloo = init_groups(ctx, OP_TIMEOUT)
    problems: list[str] = []
    # Sizes from empty to past the segment's slot, so some calls take several rounds.
    sizes = [0, 1, 1000, 3 << 20, 7, 4096]
    for pattern in range(4):
        grpc_out: list[torch.Tensor] = []
        works = []
        for i, n in enumerate(sizes * 2):
            # Which calls are async differs between ranks and patterns.
            async_op = (i + ctx.rank + pattern) % (2 + pattern % 2) == 0
            t = torch.arange(n, dtype=torch.float32) * (ctx.rank + 1) + i
            grpc_out.append(t)
            works.append(dist.all_reduce(t, async_op=async_op))
        for w in works:
            if w is not None:
                w.wait()
        for i, n in enumerate(sizes * 2):
            expected = torch.arange(n, dtype=torch.float32) * (ctx.rank + 1) + i
            dist.all_reduce(expected, group=gloo)
            if not torch.equal(grpc_out[i], expected):
                problems.append(
                    f"pattern {pattern}, call {i} ({n} elements) differs from gloo's"
                )
    return problems


@pytest.mark.parametrize("world", [2, 3])
def test_calls_run_in_issue_order_whichever_are_async(world: int) -> None:
    for res in run_ranks(_mixed_order, world, timeout_s=240):
        assert res.value == [], (res.rank, res.value)


# --------------------------------------------------------------------------- waiting


def _other_threads_run(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    store_barrier(store, ctx.world_size, "ready")
    if ctx.rank != 0:
        time.sleep(LATE_S)
        dist.all_reduce(torch.ones(16))
        return {}
    ticks = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.05)
    before = ticks
    tensor = torch.ones(16)
    dist.all_reduce(tensor)
    during = ticks - before
    stop.set()
    ticker.join()
    return {"ticks": during, "sum": tensor[0].item()}


def test_a_blocking_call_lets_other_python_threads_run_while_it_waits() -> None:
    rank0 = run_ranks(_other_threads_run, 2, timeout_s=120)[0].value
    assert rank0["sum"] == 2.0, rank0
    # About LATE_S / 1 ms ticks if the GIL is free; none if the call held it.
    assert rank0["ticks"] > 100, rank0


def _peer_dies(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    dist.all_reduce(torch.ones(8))  # the segment or the links are in use
    store_barrier(store, ctx.world_size, "ready")
    if ctx.rank == 1:
        time.sleep(0.5)
        os._exit(7)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(8))
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return {"error": error, "s": time.monotonic() - started}


def test_a_blocking_call_fails_naming_a_peer_that_died() -> None:
    results = run_ranks(_peer_dies, 2, timeout_s=120, expected_exitcodes={1: 7})
    rank0 = next(r.value for r in results if r.rank == 0)
    assert rank0["error"] is not None and "rank 1" in rank0["error"], rank0
    assert rank0["s"] < 30, rank0  # long before the 60 s op timeout


def _abort_from_another_thread(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    dist.all_reduce(torch.ones(8))
    store_barrier(store, ctx.world_size, "ready")
    if ctx.rank == 1:
        # Never joins; waits until rank 0 is done, then leaves.
        store.wait(["rank 0 done"], timedelta(seconds=60))
        return {}
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    abort_s: list[float] = []

    def abort_soon() -> None:
        time.sleep(0.5)
        started = time.monotonic()
        backend.abort()
        abort_s.append(time.monotonic() - started)

    aborter = threading.Thread(target=abort_soon)
    aborter.start()
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(8))
        error = None
    except RuntimeError as exc:
        error = str(exc)
    call_s = time.monotonic() - started
    aborter.join()
    store.set("rank 0 done", "1")
    return {"error": error, "call_s": call_s, "abort_s": abort_s[0]}


def test_abort_from_another_thread_ends_a_blocking_call() -> None:
    results = run_ranks(_abort_from_another_thread, 2, timeout_s=120)
    rank0 = next(r.value for r in results if r.rank == 0)
    assert rank0["error"] is not None and "abort" in rank0["error"], rank0
    # The README's bound for abort with an op in flight, and the call ends with it.
    assert rank0["abort_s"] < 2.0, rank0
    assert rank0["call_s"] < 0.5 + 2.0 + 1.0, rank0
