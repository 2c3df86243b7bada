"""Run a function on W real ranks on loopback and collect what each rank returned.

Ranks are started with the multiprocessing *spawn* context: gRPC keeps threads
and sockets that do not survive ``fork``. The parent hosts the rendezvous
TCPStore (port 0, so no port race) and outlives every rank, which also lets a
test kill a rank on purpose. Every child dies with the parent (PDEATHSIG) and
the whole process tree is killed on timeout, so a hang becomes a failure.

Spawning costs a torch import per rank (seconds on 2 cores), so test modules
run many cases inside one spawn and report per-case outcomes with
:func:`run_cases`; :class:`CaseReport` turns those into per-test assertions.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from job_runner import kill_tree

from torch_grpc_pg._ports import LOOPBACK, free_port

BACKEND_ENV = "TORCH_GRPC_PG_TEST_BACKEND"
REFERENCE_BACKEND = "gloo"

# Generous for the collectives under test: a wrong result must show up as a
# failed comparison, not as a timeout caused by 4 ranks sharing 2 cores.
DEFAULT_PG_TIMEOUT = timedelta(seconds=90)
REFERENCE_TIMEOUT = timedelta(seconds=120)
STORE_TIMEOUT = timedelta(seconds=120)


def backend_under_test() -> str:
    """The backend the suite tests; ``gloo`` validates the tests themselves."""
    return os.environ.get(BACKEND_ENV, "grpc")


def ensure_backend_importable() -> None:
    """Fail in the parent, once, instead of in every spawned rank."""
    if backend_under_test() == "grpc":
        import torch_grpc_pg  # noqa: F401  (registers the "grpc" backend)


@dataclass(frozen=True)
class RankContext:
    """What a rank function needs to join the test's process groups."""

    rank: int
    world_size: int
    backend: str
    store_port: int
    tmp_dir: str
    # Free ports chosen by the parent, for tests of the env:// and tcp:// init methods.
    spare_ports: tuple[int, ...] = ()

    def store(self) -> dist.Store:
        return dist.TCPStore(
            LOOPBACK,
            self.store_port,
            is_master=False,
            timeout=STORE_TIMEOUT,
            wait_for_workers=False,
        )


_init_count = 0


def _next_tag() -> str:
    # Every rank calls init the same number of times in the same order, so the
    # counter gives each (re)initialisation its own keys in the shared store.
    global _init_count
    _init_count += 1
    return f"init{_init_count}"


def store_barrier(store: dist.Store, world_size: int, key: str) -> None:
    """Line ranks up with a long timeout before anything with a short one starts.

    ``init_process_group`` applies its (deliberately short, in fault tests)
    timeout to rendezvous too, and ranks finish importing torch seconds apart.
    """
    store.add(key, 1)
    deadline = time.monotonic() + STORE_TIMEOUT.total_seconds()
    while store.add(key, 0) < world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"store barrier {key!r}: not all {world_size} ranks arrived"
            )
        time.sleep(0.01)


def init_default_group(
    ctx: RankContext, timeout: timedelta = DEFAULT_PG_TIMEOUT
) -> None:
    """Init the default group with the backend under test, through the parent's store."""
    tag = _next_tag()
    store = dist.PrefixStore(tag, ctx.store())
    store_barrier(store, ctx.world_size, "arrived")
    dist.init_process_group(
        ctx.backend,
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timeout,
    )
    assert dist.get_backend() == ctx.backend, dist.get_backend()


def init_groups(
    ctx: RankContext, timeout: timedelta = DEFAULT_PG_TIMEOUT
) -> dist.ProcessGroup:
    """Init the default group with the backend under test; return a gloo reference group."""
    init_default_group(ctx, timeout)
    reference = dist.new_group(backend=REFERENCE_BACKEND, timeout=REFERENCE_TIMEOUT)
    assert reference is not None
    return reference


# --------------------------------------------------------------------------- parent side


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: str | None = None  # traceback of an exception the rank function raised
    exitcode: int | None = None
    note: str | None = None  # what the harness saw: no result, did not exit, ...

    @property
    def reported(self) -> bool:
        return self.error is None and self.note is None


class HarnessError(AssertionError):
    """Ranks crashed, hung, or exited other than expected."""


def _kill_tree(proc: mp.process.BaseProcess) -> None:
    if proc.pid is not None:
        kill_tree(proc.pid, timeout_s=10)


def _drain(results_queue: Any, results: dict[int, RankResult], timeout: float) -> None:
    try:
        rank, ok, payload = results_queue.get(timeout=timeout)
    except queue.Empty:
        return
    if ok:
        results[rank] = RankResult(rank, value=pickle.loads(payload))
    else:
        results[rank] = RankResult(rank, error=payload)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 240.0,
    exit_grace_s: float = 30.0,
    expected_exitcodes: Mapping[int, int] | None = None,
    spare_ports: int = 0,
) -> list[RankResult]:
    """Run ``fn(ctx, *args)`` on ``world_size`` spawned ranks; return per-rank results.

    ``fn`` must be a picklable top-level function. Raises :class:`HarnessError`
    when a rank raised, hung past ``timeout_s``, did not exit within
    ``exit_grace_s`` of returning, or exited with a code other than the one in
    ``expected_exitcodes`` (default 0). A rank expected to die reports nothing.
    """
    ensure_backend_importable()
    expected = dict.fromkeys(range(world_size), 0)
    expected.update(expected_exitcodes or {})
    spawn = mp.get_context("spawn")
    server = dist.TCPStore(
        LOOPBACK, 0, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False
    )
    results_queue = spawn.Queue()
    ports = tuple(free_port() for _ in range(spare_ports))
    with tempfile.TemporaryDirectory(prefix="grpc-pg-test-") as tmp_dir:
        procs = [
            spawn.Process(
                target=_rank_entry,
                args=(
                    fn,
                    RankContext(
                        rank,
                        world_size,
                        backend_under_test(),
                        server.port,
                        tmp_dir,
                        ports,
                    ),
                    args,
                    results_queue,
                ),
                name=f"rank{rank}",
            )
            for rank in range(world_size)
        ]
        try:
            for proc in procs:
                proc.start()
            results = _collect(procs, results_queue, expected, timeout_s, exit_grace_s)
        finally:
            for proc in procs:
                if proc.is_alive():
                    _kill_tree(proc)
            results_queue.close()
            del server
    _raise_on_failure(results, expected, fn)
    return results


def _collect(
    procs: list[mp.process.BaseProcess],
    results_queue: Any,
    expected: Mapping[int, int],
    timeout_s: float,
    exit_grace_s: float,
) -> list[RankResult]:
    results: dict[int, RankResult] = {}
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(procs)))
    while pending and time.monotonic() < deadline:
        _drain(results_queue, results, timeout=0.2)
        pending -= results.keys()
        for rank in list(pending):
            if procs[rank].exitcode is not None:
                # A result put just before exit is already in the pipe.
                _drain(results_queue, results, timeout=1.0)
                if rank not in results:
                    note = (
                        None
                        if expected[rank] != 0
                        else "exited without reporting a result"
                    )
                    results[rank] = RankResult(rank, note=note)
                pending.discard(rank)
    for rank in pending:
        results[rank] = RankResult(
            rank, note=f"still running after the {timeout_s:.0f}s timeout"
        )
        _kill_tree(procs[rank])
    exit_deadline = time.monotonic() + exit_grace_s
    for rank, proc in enumerate(procs):
        proc.join(max(0.0, exit_deadline - time.monotonic()))
        if proc.exitcode is None:
            _kill_tree(proc)
            proc.join(5)
            if results[rank].note is None:
                results[
                    rank
                ].note = f"did not exit within {exit_grace_s:.0f}s of finishing"
        results[rank].exitcode = proc.exitcode
    return [results[rank] for rank in range(len(procs))]


def _raise_on_failure(
    results: list[RankResult], expected: Mapping[int, int], fn: Callable[..., Any]
) -> None:
    problems = []
    for res in results:
        if res.error is not None:
            problems.append(f"rank {res.rank} raised:\n{res.error}")
        if res.note is not None:
            problems.append(f"rank {res.rank} {res.note} (exit code {res.exitcode})")
        elif res.exitcode != expected[res.rank]:
            problems.append(
                f"rank {res.rank} exit code {res.exitcode}, expected {expected[res.rank]}"
            )
    if problems:
        raise HarnessError(f"{fn.__qualname__}: " + "\n".join(problems))


# --------------------------------------------------------------------------- child side


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _rank_entry(
    fn: Callable[..., Any], ctx: RankContext, args: tuple[Any, ...], results_queue: Any
) -> None:
    _die_with_parent()
    # Several ranks share 2 cores: intra-op threads would only fight each other.
    torch.set_num_threads(1)
    if ctx.backend == "grpc":
        import torch_grpc_pg  # noqa: F401
    try:
        payload = pickle.dumps(fn(ctx, *args))
        results_queue.put((ctx.rank, True, payload))
    except BaseException:
        results_queue.put((ctx.rank, False, traceback.format_exc()))
    # Leaving a group initialised must not keep the process from exiting; the
    # harness reports a rank that hangs here as "did not exit".
    if dist.is_initialized():
        dist.destroy_process_group()
    results_queue.close()
    results_queue.join_thread()


# --------------------------------------------------------------------------- many cases per spawn

Check = Callable[[], None]


def run_cases(cases: Mapping[str, Check]) -> dict[str, str | None]:
    """Run each check in order; map its name to None (passed) or the failure text.

    One failing case must not stop the others, so that a single spawn still
    reports on every case.
    """
    outcomes: dict[str, str | None] = {}
    for name, check in cases.items():
        try:
            check()
            outcomes[name] = None
        except Exception as exc:
            outcomes[name] = (
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}"
            )
    return outcomes


@functools.cache
def spawn_cases(
    fn: Callable[..., Any], world_size: int, **run_kwargs: Any
) -> CaseReport:
    """Runs ``fn`` (which returns :func:`run_cases` outcomes) on ``world_size`` ranks, once
    per distinct call: every test of a module then asserts its slice of the same spawn."""
    return CaseReport.from_spawn(lambda: run_ranks(fn, world_size, **run_kwargs))


@dataclass
class CaseReport:
    """Per-case outcomes of one spawn, merged over ranks, or why the spawn failed."""

    outcomes: dict[str, list[str]] = field(default_factory=dict)
    spawn_error: str | None = None

    @classmethod
    def from_spawn(cls, launch: Callable[[], list[RankResult]]) -> CaseReport:
        try:
            results = launch()
        except HarnessError as exc:
            return cls(spawn_error=str(exc))
        report = cls()
        for res in results:
            for name, failure in res.value.items():
                messages = report.outcomes.setdefault(name, [])
                if failure is not None:
                    messages.append(f"rank {res.rank}: {failure}")
        return report

    def assert_passed(self, prefix: str) -> None:
        """Every case whose name starts with ``prefix`` passed on every rank; at least one ran."""
        # pytrace=False: the case failures carry their own tracebacks; the
        # harness frames around them would only bury those.
        if self.spawn_error is not None:
            pytest.fail(self.spawn_error, pytrace=False)
        selected = {k: v for k, v in self.outcomes.items() if k.startswith(prefix)}
        if not selected:
            pytest.fail(f"no case named {prefix!r}* ran", pytrace=False)
        failed = {k: v for k, v in selected.items() if v}
        if failed:
            details = "\n".join(
                f"[{name}]\n" + "\n".join(msgs) for name, msgs in failed.items()
            )
            pytest.fail(
                f"{len(failed)} of {len(selected)} cases failed:\n{details}",
                pytrace=False,
            )
