"""Bad input and faults raise RuntimeError on every rank involved, never hang.

Each scenario gets its own spawn: a fault may leave the group failed. Groups
use a short timeout, and every rank reports what it raised, how long that
took and how long destroy_process_group() took afterwards; the harness then
checks that every surviving rank exited with code 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    RankContext,
    init_default_group,
    run_ranks,
    store_barrier,
)
from layouts import MEDIUM_NUMEL

FAULT_TIMEOUT = timedelta(seconds=10)
# How far past the group timeout an error may arrive (ranks share 2 cores).
LATE_S = 5.0
PROMPT_DESTROY_S = 5.0
SMALL_NUMEL = 1000
LARGE_NUMEL = (64 << 20) // 4


@dataclass(frozen=True)
class Outcome:
    """What one rank saw; picklable so that the parent can assert on it."""

    rank: int
    error_type: str | None  # None: the call returned normally
    is_runtime_error: bool
    message: str
    elapsed_s: float
    destroy_s: float


def _attempt(ctx: RankContext, call: Callable[[], object]) -> Outcome:
    """Run ``call`` with all ranks starting together, then destroy the group."""
    store_barrier(ctx.store(), ctx.world_size, "start fault")
    started = time.monotonic()
    error: Exception | None = None
    try:
        call()
    except Exception as exc:
        error = exc
    elapsed = time.monotonic() - started
    started = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - started
    return Outcome(
        rank=ctx.rank,
        error_type=None if error is None else type(error).__name__,
        is_runtime_error=isinstance(error, RuntimeError),
        message="" if error is None else str(error),
        elapsed_s=elapsed,
        destroy_s=destroy_s,
    )


def _names_op(message: str, op: str) -> bool:
    # "allreduce", "all_reduce" and "AllReduce" all name the op.
    return op in re.sub(r"[^a-z]", "", message.lower())


def _names_rank(message: str, rank: int) -> bool:
    # "rank 2" or "Rank 2" as words: not "#2", "2 elements", "rank 20" or "rank 2.5".
    return re.search(rf"\b[Rr]ank {rank}(?!\w|\.\d)", message) is not None


def _assert_failed(
    outcome: Outcome,
    op: str,
    ranks: list[int],
    *,
    within_s: float = FAULT_TIMEOUT.total_seconds() + LATE_S,
) -> None:
    where = f"rank {outcome.rank}"
    assert outcome.error_type is not None, f"{where}: nothing was raised"
    assert outcome.is_runtime_error, (
        f"{where}: raised {outcome.error_type}, not a RuntimeError: {outcome.message}"
    )
    assert outcome.elapsed_s < within_s, (
        f"{where}: raised after {outcome.elapsed_s:.1f}s, allowed {within_s:.0f}s"
    )
    assert _names_op(outcome.message, op), (
        f"{where}: message does not name {op!r}: {outcome.message}"
    )
    for rank in ranks:
        assert _names_rank(outcome.message, rank), (
            f"{where}: message does not name rank {rank}: {outcome.message}"
        )
    assert outcome.destroy_s < PROMPT_DESTROY_S, (
        f"{where}: destroy_process_group took {outcome.destroy_s:.1f}s after the error"
    )


def _run(
    scenario: Callable[..., Outcome], world: int, *args: object, **kwargs: Any
) -> list[Outcome]:
    results = run_ranks(scenario, world, *args, timeout_s=120, **kwargs)
    return [res.value for res in results if res.value is not None]


# --------------------------------------------------------------------------- mismatched calls


def _count_mismatch(ctx: RankContext, numel: int, odd_rank: int) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.ones(numel + (ctx.rank == odd_rank))
    return _attempt(ctx, lambda: dist.all_reduce(tensor))


@pytest.mark.parametrize("numel", [SMALL_NUMEL, MEDIUM_NUMEL], ids=["one-shot", "ring"])
def test_different_element_counts(numel: int) -> None:
    for outcome in _run(_count_mismatch, 2, numel, 1):
        _assert_failed(outcome, "allreduce", [0, 1])


def test_different_element_counts_on_one_of_three_ranks() -> None:
    # Whoever detects it, every rank must learn that rank 2 was the odd one out.
    for outcome in _run(_count_mismatch, 3, SMALL_NUMEL, 2):
        _assert_failed(outcome, "allreduce", [2])


def _gather_size_mismatch(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    # Sizes differ by rank, but rank 2 expects 5 elements from rank 1, which sends 4.
    sizes = [3, 4, 6]
    outputs = [torch.zeros(n) for n in sizes]
    if ctx.rank == 2:
        outputs[1] = torch.zeros(5)
    tensor = torch.ones(sizes[ctx.rank])
    return _attempt(ctx, lambda: dist.all_gather(outputs, tensor))


def test_all_gather_of_different_sizes_that_do_not_match() -> None:
    outcomes = _run(_gather_size_mismatch, 3)
    # Rank 2 finds rank 1's block the wrong size. Ranks 0 and 1 received what
    # they expected and may finish the op before rank 2's abort reaches them,
    # as in an all-to-all, where each pair checks only its own block.
    _assert_failed(outcomes[2], "allgather", [1, 2])


def _dtype_mismatch(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    # Same element size, so only the dtype itself can tell them apart.
    dtype = torch.float32 if ctx.rank == 0 else torch.int32
    tensor = torch.ones(SMALL_NUMEL, dtype=dtype)
    return _attempt(ctx, lambda: dist.all_reduce(tensor))


def test_different_dtypes() -> None:
    for outcome in _run(_dtype_mismatch, 2):
        _assert_failed(outcome, "allreduce", [0, 1])


def _op_mismatch(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.ones(SMALL_NUMEL)
    if ctx.rank == 0:
        return _attempt(ctx, lambda: dist.all_reduce(tensor))
    outputs = [torch.empty(SMALL_NUMEL) for _ in range(ctx.world_size)]
    return _attempt(ctx, lambda: dist.all_gather(outputs, tensor))


def test_different_collectives() -> None:
    outcomes = _run(_op_mismatch, 2)
    # Each rank's message names the collective that rank called.
    _assert_failed(outcomes[0], "allreduce", [0, 1])
    _assert_failed(outcomes[1], "allgather", [0, 1])


def _root_mismatch(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.ones(SMALL_NUMEL)
    return _attempt(ctx, lambda: dist.broadcast(tensor, src=ctx.rank))


def test_different_broadcast_roots() -> None:
    for outcome in _run(_root_mismatch, 2):
        _assert_failed(outcome, "broadcast", [0, 1])


def _reduce_op_mismatch(ctx: RankContext, numel: int) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.arange(numel, dtype=torch.float32)
    op = dist.ReduceOp.SUM if ctx.rank == 0 else dist.ReduceOp.MAX
    return _attempt(ctx, lambda: dist.all_reduce(tensor, op=op))


@pytest.mark.parametrize("numel", [SMALL_NUMEL, MEDIUM_NUMEL], ids=["one-shot", "ring"])
def test_different_reduce_ops(numel: int) -> None:
    # SUM on one rank and MAX on the other would each return a plausible tensor.
    for outcome in _run(_reduce_op_mismatch, 2, numel):
        _assert_failed(outcome, "allreduce", [0, 1])
        assert "SUM" in outcome.message and "MAX" in outcome.message, outcome.message


# --------------------------------------------------------------------------- unsupported input


def _unsupported_input(ctx: RankContext, kind: str) -> tuple[Outcome | None, bool]:
    """Rank 0 makes a bad call alone; then both ranks check the group still works."""
    init_default_group(ctx, FAULT_TIMEOUT)
    outcome = None
    if ctx.rank == 0:
        started = time.monotonic()
        try:
            if kind == "complex_max":
                # torch's frontend refuses MAX on complex with a ValueError
                # before any backend sees it; ask the backend itself.
                opts = dist.AllreduceOptions()
                opts.reduceOp = dist.ReduceOp.MAX
                backend = dist.group.WORLD._get_backend(torch.device("cpu"))
                backend.allreduce([torch.ones(4, dtype=torch.complex64)], opts).wait()
            elif kind == "sparse_max":
                # Sparse tensors are summed, as with gloo; other ops are refused.
                dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.MAX)
            elif kind == "sparse_broadcast":
                # torch sends a sparse tensor to no backend but all_reduce's;
                # ask the backend itself.
                backend = dist.group.WORLD._get_backend(torch.device("cpu"))
                backend.broadcast(
                    [torch.ones(4).to_sparse()], dist.BroadcastOptions()
                ).wait()
            elif kind in EXPANDED_OUTPUT_CALLS:
                # Four elements on one float of memory: the op cannot write its
                # results into it (torch's copy_ would refuse after the op ran).
                EXPANDED_OUTPUT_CALLS[kind][1](torch.zeros(1).expand(4))
            else:
                raise ValueError(kind)
            error: Exception | None = None
        except Exception as exc:
            error = exc
        outcome = Outcome(
            rank=0,
            error_type=None if error is None else type(error).__name__,
            is_runtime_error=isinstance(error, RuntimeError),
            message="" if error is None else str(error),
            elapsed_s=time.monotonic() - started,
            destroy_s=0.0,
        )
    store_barrier(ctx.store(), ctx.world_size, f"after {kind}")
    # Rejected at the call, before anything was sent: the group is unharmed.
    tensor = torch.full((SMALL_NUMEL,), float(ctx.rank + 1))
    dist.all_reduce(tensor)
    still_works = bool(torch.equal(tensor, torch.full((SMALL_NUMEL,), 3.0)))
    return outcome, still_works


# Calls whose output is an expanded view, made by rank 0 alone in a world of
# two: the op the message must name (letters only, see _names_op), and the call.
EXPANDED_OUTPUT_CALLS: dict[str, tuple[str, Callable[[torch.Tensor], object]]] = {
    "expanded_all_reduce": ("allreduce", lambda t: dist.all_reduce(t)),
    "expanded_broadcast_to_it": ("broadcast", lambda t: dist.broadcast(t, src=1)),
    "expanded_all_gather_output": (
        "allgather",
        lambda t: dist.all_gather([t, torch.zeros(4)], torch.ones(4)),
    ),
    "expanded_all_gather_into_tensor": (
        "allgatherintotensor",
        lambda t: dist.all_gather_into_tensor(t, torch.ones(2)),
    ),
    "expanded_reduce_scatter_tensor": (
        "reducescattertensor",
        lambda t: dist.reduce_scatter_tensor(t, torch.ones(8)),
    ),
    "expanded_all_to_all_single": (
        "alltoallbase",
        lambda t: dist.all_to_all_single(t, torch.ones(4)),
    ),
    "expanded_scatter": ("scatter", lambda t: dist.scatter(t, src=1)),
    "expanded_recv": ("recv", lambda t: dist.recv(t, src=1)),
}


@pytest.mark.parametrize(
    "kind", ["complex_max", "sparse_max", "sparse_broadcast", *EXPANDED_OUTPUT_CALLS]
)
def test_unsupported_input_raises_at_the_call(kind: str) -> None:
    results = run_ranks(_unsupported_input, 2, kind, timeout_s=120)
    outcome, _ = results[0].value
    assert outcome is not None
    if kind in EXPANDED_OUTPUT_CALLS:
        op = EXPANDED_OUTPUT_CALLS[kind][0]
    else:
        op = "broadcast" if kind == "sparse_broadcast" else "allreduce"
    # Local validation: no waiting on a peer, which makes no call at all here.
    _assert_failed(outcome, op, [0], within_s=2.0)
    if kind in EXPANDED_OUTPUT_CALLS:
        assert "share memory" in outcome.message, outcome.message
    if kind == "sparse_max":
        assert "ReduceOp.SUM only" in outcome.message, outcome.message
    if kind == "sparse_broadcast":
        assert "sparse tensors are not supported" in outcome.message, outcome.message
    for res in results:
        assert res.value[1], (
            f"rank {res.rank}: the group was broken by the rejected call"
        )


# --------------------------------------------------------------------------- faulty peers


def _silent_peer(ctx: RankContext, silent: int) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.ones(SMALL_NUMEL)
    if ctx.rank == silent:
        # Alive and connected, but never calls the collective.
        pause = FAULT_TIMEOUT.total_seconds() + 3
        return _attempt(ctx, lambda: time.sleep(pause))
    return _attempt(ctx, lambda: dist.all_reduce(tensor))


@pytest.mark.slow
def test_silent_peer_times_out_naming_it() -> None:
    outcomes = _run(_silent_peer, 2, 1)
    _assert_failed(outcomes[0], "allreduce", [1])
    # A peer that is merely slow must get the whole timeout.
    assert outcomes[0].elapsed_s > 0.9 * FAULT_TIMEOUT.total_seconds(), outcomes[0]
    assert outcomes[1].destroy_s < PROMPT_DESTROY_S, outcomes[1]


@pytest.mark.slow
def test_silent_peer_in_world_of_three() -> None:
    outcomes = _run(_silent_peer, 3, 2)
    for outcome in outcomes[:2]:
        _assert_failed(outcome, "allreduce", [2])
        assert outcome.elapsed_s > 0.9 * FAULT_TIMEOUT.total_seconds(), outcome
    assert outcomes[2].destroy_s < PROMPT_DESTROY_S, outcomes[2]


VICTIM = 1
# One 64 MiB allreduce can take well under 0.1 s on loopback: every rank runs
# a series of them so that the kill always lands inside one, however fast.
ALLREDUCES = 200


def _allreduce_series(tensor: torch.Tensor) -> None:
    for _ in range(ALLREDUCES):
        dist.all_reduce(tensor)


def _killed_mid_allreduce(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    tensor = torch.ones(LARGE_NUMEL)
    if ctx.rank == VICTIM:
        store_barrier(ctx.store(), ctx.world_size, "start fault")
        # Dies from another thread while this one is inside a collective.
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
        _allreduce_series(tensor)
        raise AssertionError("the victim outlived its SIGKILL")
    return _attempt(ctx, lambda: _allreduce_series(tensor))


@pytest.mark.parametrize("world", [2, 3], ids=lambda w: f"w{w}")
def test_peer_killed_during_64mib_allreduce(world: int) -> None:
    outcomes = _run(
        _killed_mid_allreduce, world, expected_exitcodes={VICTIM: -signal.SIGKILL}
    )
    assert [o.rank for o in outcomes] == [r for r in range(world) if r != VICTIM]
    for outcome in outcomes:
        _assert_failed(outcome, "allreduce", [VICTIM])


# A peer that stops taking data while this rank's chunks wait to reach it: in
# the socket or gRPC's buffers (shared_memory=0, TCP), or in the shared ring's
# queue. The sender has received all it needs and only waits for its chunks to
# be taken, so its op can end only through the link's end or its timeout.
STALL_AFTER_S = 0.05
KILL_AT_S = 1.5
STALL_TIMEOUT = timedelta(seconds=3)
# The environment that sends a link's chunks down each path.
LINK_PATHS = {
    "socket": {"TORCH_GRPC_PG_SHARED_MEMORY": "0"},
    "tcp": {"TORCH_GRPC_PG_UNIX_SOCKETS": "0"},
    "ring": {},
}


def _stall_call(op: str, tensor: torch.Tensor, rank: int) -> None:
    if op == "broadcast":
        dist.broadcast(tensor, 0)
    elif op == "send":
        if rank == 0:
            dist.send(tensor, 1)
        else:
            dist.recv(tensor, 0)
    else:
        dist.all_reduce(tensor)


def _peer_stalls(ctx: RankContext, op: str, path: str, kill: bool) -> Outcome:
    os.environ.update(LINK_PATHS[path])
    init_default_group(ctx, FAULT_TIMEOUT if kill else STALL_TIMEOUT)
    tensor = torch.ones(LARGE_NUMEL // 4)

    def series() -> None:
        for _ in range(100_000):
            _stall_call(op, tensor, ctx.rank)

    store = ctx.store()
    if ctx.rank == VICTIM:
        store.set("victim pid", str(os.getpid()))
        store_barrier(store, ctx.world_size, "start fault")
        # Stops in the middle of the series and takes no more data.
        threading.Timer(STALL_AFTER_S, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        series()
        raise AssertionError("the victim outlived its SIGSTOP")
    victim = int(store.get("victim pid"))
    if kill:
        threading.Timer(KILL_AT_S, os.kill, (victim, signal.SIGKILL)).start()
    try:
        return _attempt(ctx, series)
    finally:
        # A stopped victim never exits on its own; a killed one may be gone already.
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


@pytest.mark.parametrize(
    ("op", "path"),
    [
        ("broadcast", "socket"),
        ("send", "socket"),
        ("allreduce", "socket"),
        ("broadcast", "tcp"),
        ("send", "ring"),
    ],
)
def test_peer_killed_while_this_rank_waits_for_it_to_take_its_data(
    op: str, path: str
) -> None:
    (outcome,) = _run(
        _peer_stalls, 2, op, path, True, expected_exitcodes={VICTIM: -signal.SIGKILL}
    )
    # The link's end fails the op, well before the group's timeout.
    _assert_failed(outcome, op, [VICTIM], within_s=KILL_AT_S + 4.0)
    assert "timed out" not in outcome.message, outcome.message


@pytest.mark.parametrize("path", ["socket", "tcp", "ring"])
def test_stalled_peer_is_named_when_this_rank_times_out_sending_to_it(
    path: str,
) -> None:
    (outcome,) = _run(
        _peer_stalls,
        2,
        "broadcast",
        path,
        False,
        expected_exitcodes={VICTIM: -signal.SIGKILL},
    )
    timeout_s = STALL_TIMEOUT.total_seconds()
    _assert_failed(outcome, "broadcast", [VICTIM], within_s=timeout_s + LATE_S)
    assert "timed out" in outcome.message, outcome.message
    assert outcome.elapsed_s > 0.9 * timeout_s, outcome
    # gRPC cannot end a call whose socket write the stopped peer never takes:
    # destroying the group leaves that link open instead of waiting forever.
    assert outcome.destroy_s < PROMPT_DESTROY_S, outcome


# --------------------------------------------------------------------------- point-to-point

P2P_TIMEOUT = timedelta(seconds=3)


def _p2p_mismatch(
    ctx: RankContext, send_numel: int, recv_numel: int, tags: tuple[int, int]
) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)

    def call() -> None:
        if ctx.rank == 0:
            dist.send(torch.ones(send_numel), dst=1, tag=tags[0])
        elif ctx.rank == 1:
            dist.recv(torch.zeros(recv_numel), src=0, tag=tags[1])
        # Every rank learns of the failed receive, rank 0 whose send went through included.
        dist.barrier()

    return _attempt(ctx, call)


@pytest.mark.parametrize(
    ("send_numel", "recv_numel", "tags", "detail"),
    [
        (10, 10, (1, 2), ("tag 1", "tag 2")),
        (10, 12, (0, 0), ("10 elements", "12 elements")),
    ],
    ids=["tag", "size"],
)
def test_recv_that_does_not_match_the_send_fails_every_rank(
    send_numel: int, recv_numel: int, tags: tuple[int, int], detail: tuple[str, str]
) -> None:
    for outcome in _run(_p2p_mismatch, 3, send_numel, recv_numel, tags):
        _assert_failed(outcome, "recv", [0, 1])
        for text in detail:
            assert text in outcome.message, (
                f"rank {outcome.rank}: no {text!r} in {outcome.message}"
            )


def _recv_without_send(ctx: RankContext) -> Outcome:
    init_default_group(ctx, P2P_TIMEOUT)

    def call() -> None:
        if ctx.rank == 1:
            dist.recv(torch.zeros(5), src=0)
        dist.barrier()

    return _attempt(ctx, call)


def test_recv_that_nobody_sends_times_out_naming_the_peer() -> None:
    within = P2P_TIMEOUT.total_seconds() + LATE_S
    for outcome in _run(_recv_without_send, 2):
        _assert_failed(
            outcome, "recv" if outcome.rank == 1 else "barrier", [0, 1], within_s=within
        )
        assert "timed out" in outcome.message, outcome.message


def _sends_head_to_head(ctx: RankContext) -> Outcome:
    init_default_group(ctx, P2P_TIMEOUT)

    def call() -> None:
        # Each rank sends more than its peer buffers before either receives.
        peer = 1 - ctx.rank
        dist.send(torch.ones(LARGE_NUMEL), dst=peer)
        dist.recv(torch.zeros(LARGE_NUMEL), src=peer)

    return _attempt(ctx, call)


def test_large_sends_head_to_head_time_out_naming_the_peer() -> None:
    within = P2P_TIMEOUT.total_seconds() + LATE_S
    for outcome in _run(_sends_head_to_head, 2):
        _assert_failed(outcome, "send", [0, 1], within_s=within)
        assert "timed out" in outcome.message, outcome.message


def _bad_peers(ctx: RankContext) -> Outcome:
    init_default_group(ctx, FAULT_TIMEOUT)
    backend = dist.distributed_c10d._get_default_group()._get_backend(
        torch.device("cpu")
    )
    messages = []
    for call in (
        lambda: backend.send([torch.ones(2)], ctx.rank, 0),
        lambda: backend.recv([torch.ones(2)], 5, 0),
        lambda: backend.send([torch.ones(2), torch.ones(2)], 1 - ctx.rank, 0),
    ):
        try:
            call()
            messages.append("")
        except RuntimeError as exc:
            messages.append(str(exc))
    # Refused at the call: the group still works.
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [2.0] * 3

    def report() -> None:
        raise RuntimeError(" | ".join(messages))

    return _attempt(ctx, report)


def test_send_to_itself_or_outside_the_group_is_refused_at_the_call() -> None:
    for outcome in _run(_bad_peers, 2):
        self_send, outside, two = outcome.message.split(" | ")
        assert "this rank" in self_send and _names_rank(self_send, outcome.rank), (
            self_send
        )
        assert "source rank 5" in outside and "[0, 2)" in outside, outside
        assert "expected one tensor" in two, two
