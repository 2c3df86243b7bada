"""The process group's lifecycle (csrc/backend/group_state.h), seen from real ranks.

- Setup fails together: when one rank cannot join, every rank raises, within a
  bound, naming that rank and its reason; a rank that leaves right after init
  does not fail its peers' init.
- Destroy and abort are bounded (2 s) with an op in flight, and work issued
  afterwards fails at once instead of hanging.
- A failed group stays failed: later calls fail at once with the original reason.
- No path from user code to std::terminate: future callbacks that raise, a
  callback that destroys its own group, threads issuing on one group at once.

Ranks report what they saw; the parent asserts on it. Ranks wait for each
other through the store, never by sleeping.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    Check,
    RankContext,
    backend_under_test,
    init_default_group,
    run_cases,
    run_ranks,
    spawn_cases,
    store_barrier,
)

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc",
    reason="the lifecycle guarantees tested here are the grpc backend's",
)

# The issue's bound for destroy_process_group() and abort() with an op in flight.
DESTROY_S = 2.0
# "At once": a call on a failed or destroyed group does not wait for anything.
AT_ONCE_S = 1.0
# The op timeout of these groups: long, so that no bound below can be met by
# waiting it out.
OP_TIMEOUT = timedelta(seconds=60)
# How soon a peer must learn that a rank aborted or left (2 loaded cores).
PEER_LEARNS_S = 10.0
SILENT = 2  # the rank that never joins the collective in flight
SMALL_NUMEL = 1000


def _backend() -> Any:
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _raised(call: Callable[[], object]) -> tuple[str | None, float]:
    """What ``call`` raised (None: nothing) and how long it took; only RuntimeError counts."""
    started = time.monotonic()
    try:
        call()
    except RuntimeError as exc:
        return str(exc), time.monotonic() - started
    return None, time.monotonic() - started


def _issue_after(backend: Any) -> tuple[str | None, float]:
    """An allreduce issued straight on a backend that was destroyed or aborted."""
    return _raised(
        lambda: backend.allreduce([torch.ones(4)], dist.AllreduceOptions()).wait()
    )


# --------------------------------------------------------------------------- destroy with an op in flight


def _destroy_in_flight(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    backend = _backend()
    tensor = torch.ones(SMALL_NUMEL)
    # Ranks 0 and 1 enter an allreduce that rank 2 never joins: they block in it.
    work = dist.all_reduce(tensor, async_op=True) if ctx.rank != SILENT else None
    store_barrier(store, ctx.world_size, "issued")
    if ctx.rank != 0:
        store.wait(["rank 0 destroyed"])
    started = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - started
    if ctx.rank == 0:
        store.set("rank 0 destroyed", "1")
    work_error, work_s = (None, 0.0) if work is None else _raised(work.wait)
    after_error, after_s = _issue_after(backend)
    return {
        "destroy_s": destroy_s,
        "work_error": work_error,
        "work_s": work_s,
        "after_error": after_error,
        "after_s": after_s,
    }


def test_destroy_with_an_op_in_flight_is_prompt_and_later_work_fails_at_once() -> None:
    results = [r.value for r in run_ranks(_destroy_in_flight, 3, timeout_s=180)]
    for rank, seen in enumerate(results):
        where = f"rank {rank}: {seen}"
        assert seen["destroy_s"] < DESTROY_S, where
        assert seen["after_error"] is not None, (
            f"{where}: work after destroy did not fail"
        )
        assert "cannot run" in seen["after_error"], where
        assert "destroyed" in seen["after_error"], where
        assert seen["after_s"] < AT_ONCE_S, where
    # Rank 0 destroyed its group under its own running allreduce.
    first = results[0]
    assert first["work_error"] is not None, (
        f"rank 0: the allreduce in flight succeeded: {first}"
    )
    assert "destroyed on rank 0" in first["work_error"], first
    assert "allreduce" in re.sub(r"[^a-z]", "", first["work_error"].lower()), first
    assert first["work_s"] < AT_ONCE_S, first
    # Rank 1 either learnt that rank 0 left, or failed at its own destroy.
    second = results[1]
    assert second["work_error"] is not None, (
        f"rank 1: the allreduce in flight succeeded: {second}"
    )
    assert (
        "rank 0" in second["work_error"]
        or "destroyed on rank 1" in second["work_error"]
    ), second


# --------------------------------------------------------------------------- abort with an op in flight


def _abort_in_flight(ctx: RankContext) -> dict[str, Any]:
    init_default_group(ctx, OP_TIMEOUT)
    store = ctx.store()
    backend = _backend()
    tensor = torch.ones(SMALL_NUMEL)
    work = dist.all_reduce(tensor, async_op=True) if ctx.rank != SILENT else None
    store_barrier(store, ctx.world_size, "issued")
    seen: dict[str, Any] = {}
    if ctx.rank == 0:
        started = time.monotonic()
        backend.abort()
        seen["abort_s"] = time.monotonic() - started
        store.set("rank 0 aborted", "1")
    else:
        store.wait(["rank 0 aborted"])
    if work is not None:
        # On rank 1: from rank 0's abort to the failure of the op it was waiting in.
        seen["work_error"], seen["work_s"] = _raised(work.wait)
    if ctx.rank == 0:
        seen["after_error"], seen["after_s"] = _issue_after(backend)
    else:
        if ctx.rank == SILENT:
            store.wait(["rank 1 saw it"])
        # The group has failed (or fails now): this call must fail promptly, naming rank 0.
        seen["later_error"], seen["later_s"] = _raised(
            lambda: dist.all_reduce(torch.ones(4))
        )
        # A failed group stays failed: once more, at once, with the same reason.
        seen["again_error"], seen["again_s"] = _raised(
            lambda: dist.all_reduce(torch.ones(4))
        )
        if ctx.rank == 1:
            store.set("rank 1 saw it", "1")
    started = time.monotonic()
    dist.destroy_process_group()
    seen["destroy_s"] = time.monotonic() - started
    return seen


def test_abort_with_an_op_in_flight_fails_it_everywhere_and_the_group_stays_failed() -> (
    None
):
    results = [r.value for r in run_ranks(_abort_in_flight, 3, timeout_s=180)]
    aborter = results[0]
    assert aborter["abort_s"] < DESTROY_S, aborter
    assert (
        aborter["work_error"] is not None
        and "aborted on rank 0" in aborter["work_error"]
    ), aborter
    assert aborter["work_s"] < AT_ONCE_S, aborter
    assert aborter["after_error"] is not None, aborter
    assert "cannot run" in aborter["after_error"], aborter
    assert "aborted on rank 0" in aborter["after_error"], aborter
    assert aborter["after_s"] < AT_ONCE_S, aborter
    # Rank 1 was blocked in the same allreduce: it must not wait out the 60 s timeout.
    peer = results[1]
    assert peer["work_error"] is not None and "rank 0" in peer["work_error"], peer
    assert peer["work_s"] < PEER_LEARNS_S, peer
    for rank in (1, 2):
        seen = results[rank]
        where = f"rank {rank}: {seen}"
        assert seen["later_error"] is not None and "rank 0" in seen["later_error"], (
            where
        )
        assert seen["later_s"] < PEER_LEARNS_S, where
        assert seen["again_error"] is not None, where
        assert "failed earlier" in seen["again_error"], where
        assert "rank 0" in seen["again_error"], where
        assert seen["again_s"] < AT_ONCE_S, where
    for rank, seen in enumerate(results):
        assert seen["destroy_s"] < DESTROY_S, f"rank {rank}: {seen}"


# --------------------------------------------------------------------------- setup fails together


def _init_outcome(ctx: RankContext, env: dict[str, str]) -> tuple[str | None, float]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _raised(lambda: init_default_group(ctx, OP_TIMEOUT))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if dist.is_initialized():
            dist.destroy_process_group()


SETUP_CONNECT_TIMEOUT_S = 30
# A setup failure must be reported well before anyone waits out a connect timeout.
SETUP_FAILS_WITHIN_S = SETUP_CONNECT_TIMEOUT_S / 2


def _setup_rank_main(ctx: RankContext) -> dict[str, Any]:
    common = {"TORCH_GRPC_PG_CONNECT_TIMEOUT": str(SETUP_CONNECT_TIMEOUT_S)}
    seen: dict[str, Any] = {}
    # Rank 2 holds another token: every link to or from it is refused.
    token = "odd-one-out" if ctx.rank == 2 else "shared-secret"
    seen["auth"] = _init_outcome(ctx, common | {"TORCH_GRPC_PG_AUTH_TOKEN": token})
    # Rank 2 cannot even start its server: it must still report why.
    bind = {"TORCH_GRPC_PG_BIND_HOST": "192.0.2.1"} if ctx.rank == 2 else {}
    seen["no_server"] = _init_outcome(ctx, common | bind)
    # Rank 0 leaves as soon as its init returns; the others' init must not fail.
    rounds = []
    for _ in range(3):
        error, _elapsed = _raised(lambda: init_default_group(ctx, OP_TIMEOUT))
        rounds.append(error)
        if dist.is_initialized() and ctx.rank == 0:
            dist.destroy_process_group()
        store_barrier(ctx.store(), ctx.world_size, f"round {len(rounds)} done")
        if dist.is_initialized():
            dist.destroy_process_group()
    seen["leave_at_once"] = rounds
    # And a group still comes up and works afterwards.
    init_default_group(ctx, OP_TIMEOUT)
    tensor = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(tensor)
    seen["works_after"] = tensor.tolist()
    dist.destroy_process_group()
    return seen


@functools.cache
def _setup_results() -> list[dict[str, Any]]:
    return [r.value for r in run_ranks(_setup_rank_main, 3, timeout_s=300)]


def _failure_lines(message: str) -> list[str]:
    return [
        line.strip()
        for line in message.splitlines()
        if re.match(r"\s+rank \d+: ", line)
    ]


def _assert_failed_together(case: str, rank_line: str) -> None:
    results = _setup_results()
    lines_by_rank = []
    for rank, seen in enumerate(results):
        message, elapsed = seen[case]
        where = f"rank {rank} [{case}]"
        assert message is not None, f"{where}: init succeeded"
        assert elapsed < SETUP_FAILS_WITHIN_S, (
            f"{where}: raised after {elapsed:.1f}s: {message}"
        )
        assert re.search(rank_line, message, re.MULTILINE), (
            f"{where}: no line matching {rank_line!r}:\n{message}"
        )
        lines_by_rank.append(_failure_lines(message))
    # Every rank raises with every failed rank's reason: the same list everywhere.
    assert all(lines == lines_by_rank[0] for lines in lines_by_rank), lines_by_rank


def test_setup_failure_on_one_rank_reaches_every_rank_with_its_reason() -> None:
    _assert_failed_together("auth", r"^\s+rank 2: .*authentication")


def test_rank_whose_server_cannot_start_still_reports_why() -> None:
    _assert_failed_together("no_server", r"^\s+rank 2: could not start its transport")


def test_rank_leaving_right_after_init_does_not_fail_the_others_init() -> None:
    for rank, seen in enumerate(_setup_results()):
        assert seen["leave_at_once"] == [None, None, None], (
            f"rank {rank}: {seen['leave_at_once']}"
        )
        assert seen["works_after"] == [6.0] * 4, f"rank {rank}: {seen['works_after']}"


# --------------------------------------------------------------------------- callbacks, threads, timeouts


def _callback_raises(ctx: RankContext) -> None:
    tensor = torch.full((4,), float(ctx.rank + 1))
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def boom(_: torch.futures.Future) -> None:
        raise ValueError(f"boom from the callback on rank {ctx.rank}")

    chained = future.then(boom)
    with pytest.raises(
        RuntimeError, match=f"boom from the callback on rank {ctx.rank}"
    ):
        chained.wait()
    future.wait()
    assert tensor.tolist() == [3.0] * 4, tensor
    # A done-callback that raises is logged by torch, never fatal.
    future2 = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    ran = threading.Event()

    def boom_done(_: torch.futures.Future) -> None:
        ran.set()
        raise ValueError("boom from a done callback")

    future2.add_done_callback(boom_done)
    future2.wait()
    assert ran.wait(60), "the done callback never ran"
    # The group is unharmed.
    check = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(check)
    assert check.tolist() == [3.0] * 4, check


def _callback_destroys_its_group(ctx: RankContext) -> None:
    def issue() -> torch.futures.Future:
        group = dist.new_group(backend=ctx.backend)
        holder = [group]
        tensor = torch.full((4,), float(ctx.rank + 1))
        future = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def destroy(fut: torch.futures.Future) -> list[float]:
            # On the worker thread: may drop the group's last reference there.
            dist.destroy_process_group(holder.pop())
            return fut.value()[0].tolist()

        return future.then(destroy)

    assert issue().wait() == [3.0] * 4
    check = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(check)
    assert check.tolist() == [3.0] * 4, check


# Threads issuing on one group at once, and ops each. More than two threads
# contend for the queue more often, which makes an out-of-order push likelier.
ISSUERS = 4
THREAD_OPS = 200


def _threads_one_group(ctx: RankContext) -> None:
    # Every op has the same shape and each rank's value depends on the rank
    # only, so any pairing across ranks is right, as long as sequence numbers
    # follow queue order (else peers see "#N+1" against "#N").
    before = _backend()._get_sequence_number_for_group()
    start = threading.Barrier(ISSUERS)
    results: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def issue(thread: int) -> None:
        try:
            tensors = [torch.full((8,), float(ctx.rank + 1)) for _ in range(THREAD_OPS)]
            start.wait(timeout=60)
            works = [dist.all_reduce(t, async_op=True) for t in tensors]
            for work in works:
                work.wait()
            results[thread] = tensors
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=issue, args=(i,)) for i in range(ISSUERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for tensors in results.values():
        for t in tensors:
            assert t.tolist() == [3.0] * 8, t
    after = _backend()._get_sequence_number_for_group()
    assert after - before == ISSUERS * THREAD_OPS, (before, after)


def _huge_timeout(ctx: RankContext) -> None:
    group = dist.new_group(backend=ctx.backend, timeout=timedelta.max)
    tensor = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [3.0] * 4, tensor
    backend = group._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta.max
    tensor = torch.full((4,), float(ctx.rank + 1))
    backend.allreduce([tensor], opts).wait()
    assert tensor.tolist() == [3.0] * 4, tensor
    dist.destroy_process_group(group)


def _user_code_rank_main(ctx: RankContext) -> dict[str, str | None]:
    init_default_group(ctx, OP_TIMEOUT)
    cases: dict[str, Check] = {
        name: functools.partial(fn, ctx)
        for name, fn in {
            "callback_raises": _callback_raises,
            "callback_destroys_its_group": _callback_destroys_its_group,
            "threads": _threads_one_group,
            "huge_timeout": _huge_timeout,
        }.items()
    }
    outcomes = run_cases(cases)
    started = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - started
    outcomes["destroy"] = (
        None if destroy_s < DESTROY_S else f"destroy took {destroy_s:.1f}s"
    )
    return outcomes


def _user_code() -> CaseReport:
    return spawn_cases(_user_code_rank_main, 2, timeout_s=240)


def test_future_callback_that_raises_does_not_kill_the_process() -> None:
    _user_code().assert_passed("callback_raises")


def test_callback_that_destroys_its_own_group() -> None:
    _user_code().assert_passed("callback_destroys_its_group")


def test_threads_issuing_on_one_group() -> None:
    _user_code().assert_passed("threads")


def test_huge_timeout_does_not_overflow() -> None:
    _user_code().assert_passed("huge_timeout")


def test_destroy_after_user_code_is_prompt() -> None:
    _user_code().assert_passed("destroy")


# --------------------------------------------------------------------------- transport faults


def _peer_dies_while_idle(ctx: RankContext) -> dict[str, Any]:
    """Rank 1 dies between collectives. Ranks 0 and 2 are in no op, so only their
    transports can notice; the group must be failed within a second, naming rank 1."""
    import signal

    from torch_grpc_pg import wire

    init_default_group(ctx, timedelta(seconds=60))
    address = _backend().tcp_address
    key = _backend().group_key
    dist.all_reduce(torch.ones(4))
    store = ctx.store()
    store_barrier(store, ctx.world_size, "before the death")
    if ctx.rank == 1:
        store.set("died at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    store.wait(["died at"])
    died_at = float(store.get("died at").decode())
    failure = ""
    deadline = time.monotonic() + 10
    while not failure and time.monotonic() < deadline:
        status = wire.read_status(address)
        failure = next(g.failure for g in status.groups if g.group_key == key)
        if not failure:
            time.sleep(0.01)
    noticed_s = time.time() - died_at
    message, call_s = _raised(lambda: dist.all_reduce(torch.ones(4)))
    return {
        "noticed_s": noticed_s,
        "failure": failure,
        "message": message,
        "call_s": call_s,
    }


def test_a_dead_peer_fails_the_group_everywhere_within_a_second() -> None:
    import signal

    results = run_ranks(
        _peer_dies_while_idle, 3, expected_exitcodes={1: -signal.SIGKILL}
    )
    for res in results:
        if res.rank == 1:
            continue
        outcome = res.value
        assert outcome["noticed_s"] < 1.0, (res.rank, outcome)
        assert re.search(r"\brank 1\b", outcome["failure"]), (res.rank, outcome)
        # The next call fails at once with that reason.
        assert outcome["message"] is not None and "rank 1" in outcome["message"], (
            res.rank,
            outcome,
        )
        assert outcome["call_s"] < 1.0, (res.rank, outcome)


# --------------------------------------------------------------------------- a rank missing, another late


# After rank 0's first look at the store: it has already opened the group by then.
LATE_S = 0.5
# Rank 0 waits this long for its peers; the late rank gives up a second sooner, so
# that it must have been admitted on arrival, not when rank 0 stopped waiting.
ADMITTING_S = 3.0


def _one_missing_one_late(ctx: RankContext) -> str | None:
    """Rank 1 never comes; rank 2 comes LATE_S after rank 0 started creating the group."""
    import torch_grpc_pg
    from torch_grpc_pg.options import Options

    store = dist.PrefixStore("one-missing-one-late", ctx.store())
    if ctx.rank == 1:
        return None
    store_barrier(ctx.store(), 2, "ranks 0 and 2 start")
    if ctx.rank == 2:
        time.sleep(LATE_S)
    return _raised(
        lambda: torch_grpc_pg._new_backend(
            store,
            ctx.rank,
            3,
            OP_TIMEOUT,
            "late",
            Options(
                connect_timeout=timedelta(
                    seconds=ADMITTING_S - (1.0 if ctx.rank == 2 else 0.0)
                )
            ),
        )
    )[0]


def test_a_late_rank_is_admitted_while_another_is_missing() -> None:
    """Rank 0 admits each peer as it arrives, not once every peer has: a peer that
    arrives late is in the group, and every rank names only the one that never came."""
    for res in run_ranks(_one_missing_one_late, 3, timeout_s=120):
        if res.rank == 1:
            continue
        message = res.value
        assert message is not None, res.rank
        assert "rank 1 did not publish an address" in message, (res.rank, message)
        assert "ranks 1, 2" not in message, (res.rank, message)
        assert "rank 2: did not publish its address" not in message, (res.rank, message)
        assert "rank 0 did not open the group" not in message, (res.rank, message)


# --------------------------------------------------------------------------- a store that outlives a group


def _short_then_whole(ctx: RankContext) -> dict[str, Any]:
    """Ranks 0 and 2 create group "g" without rank 1, which never comes, and fail; then
    all three create "g" again on the same store, as torchrun's next attempt does after
    a rank died before its init. The store still holds the short instance's keys."""
    import torch_grpc_pg
    from torch_grpc_pg.options import Options

    store = dist.PrefixStore("short-then-whole", ctx.store())
    seen: dict[str, Any] = {}
    if ctx.rank != 1:
        # Together, so that only rank 1 is missing from the short instance.
        store_barrier(ctx.store(), 2, "the short instance starts")
        seen["short"] = _raised(
            lambda: torch_grpc_pg._new_backend(
                store,
                ctx.rank,
                3,
                timedelta(seconds=60),
                "g",
                Options(connect_timeout=timedelta(seconds=2)),
            )
        )[0]
    store_barrier(ctx.store(), ctx.world_size, "the short instance is over")
    started = time.monotonic()
    backend = torch_grpc_pg._new_backend(
        store, ctx.rank, 3, timedelta(seconds=60), "g", Options()
    )
    seen["setup_s"] = time.monotonic() - started
    x = torch.full((5,), float(ctx.rank + 1))
    backend.allreduce([x]).wait()
    seen["sum"] = x.tolist()
    backend.shutdown()
    return seen


def test_a_group_created_again_on_a_store_left_by_a_short_instance() -> None:
    for res in run_ranks(_short_then_whole, 3, timeout_s=120):
        seen = res.value
        if res.rank != 1:
            assert seen["short"] is not None, seen
            assert "rank 1 did not publish an address" in seen["short"], seen
        assert seen["sum"] == [6.0] * 5, (res.rank, seen)
        # Not after a connect timeout (60 s): the short instance's keys were not read as its own.
        assert seen["setup_s"] < 10, (res.rank, seen)
