"""torch_grpc_pg.torchft: the reconfigurable group torchft's Manager drives, on its own
(configure on a new store prefix, a dead peer seen by errored(), abort within the
README's bound) and under torchft's own integration tests, held to gloo's results
(tests/torchft_suite/run.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
import torch

from dist_harness import RankContext, run_ranks

pytest.importorskip("torchft", reason="torchft is in requirements-dev.txt")

SUITE = Path(__file__).resolve().parent / "torchft_suite"


def _load_runner() -> ModuleType:
    # By path, under a name of its own: tests/conformance has a run.py too.
    spec = importlib.util.spec_from_file_location("torchft_suite_run", SUITE / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_runner = _load_runner()
FAILED, PASSED, SKIPPED = _runner.FAILED, _runner.PASSED, _runner.SKIPPED
compare = _runner.compare

# docs/usage.md: destroy_process_group() and abort() return within about 2 s.
ABORT_BOUND_S = 2.5
# Setup of a 3-rank group on loopback takes well under a second; 2 busy cores are slower.
CONFIGURE_BOUND_S = 10.0


def _outcome(result: str, **counts: object) -> dict[str, object]:
    return {
        "result": result,
        "message": "" if result == PASSED else "boom",
        "instances": 1,
        "configures": 2,
        "backends": [],
        **counts,
    }


def test_compare_holds_grpc_to_what_gloo_passes() -> None:
    gloo = {"a": _outcome(PASSED), "b": _outcome(PASSED), "c": _outcome(SKIPPED)}
    grpc = {
        "a": _outcome(PASSED, backends=["torchft-grpc"]),
        "b": _outcome(FAILED),
        "c": _outcome(FAILED),
    }
    assert compare(gloo, grpc) == [
        "b: passes with gloo, failed with grpc: boom",
        "c: fails with grpc (gloo: skipped): boom",
    ]
    assert compare({"a": _outcome(FAILED)}, {"a": _outcome(FAILED)}) == [
        "gloo passed no test: nothing was compared"
    ]


def test_compare_fails_a_run_that_did_not_use_grpc() -> None:
    gloo = {"a": _outcome(PASSED)}
    assert compare(gloo, {"a": _outcome(PASSED, instances=0, configures=0)}) == [
        "a: built no grpc process group",
        "a: never configured a grpc process group",
    ]
    assert compare(gloo, {"a": _outcome(PASSED, backends=["torchft-gloo"])}) == [
        "a: configured ['torchft-gloo'], not grpc's"
    ]


def test_a_grpc_failure_runs_again_and_counts_only_if_it_then_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reruns: list[list[str] | None] = []

    def fake_run(
        backend: str,
        keyword: str | None,
        out_dir: Path,
        verbose: bool,
        targets: list[str] | None = None,
        label: str = "",
    ) -> tuple[dict[str, dict[str, object]], float]:
        reruns.append(targets)
        # "a" was a flake and passes now; "b" fails every time.
        return {
            "T::a": _outcome(PASSED, file="f"),
            "T::b": _outcome(FAILED, file="f"),
        }, 0.0

    monkeypatch.setattr(_runner, "run_backend", fake_run)
    gloo = {"T::a": _outcome(PASSED), "T::b": _outcome(PASSED)}
    grpc = {"T::a": _outcome(FAILED, file="f"), "T::b": _outcome(FAILED, file="f")}
    notes = _runner.rerun_shortfalls(gloo, grpc, tmp_path, False)
    assert reruns == [["f::T::a", "f::T::b"], ["f::T::b"]]
    assert notes == ["T::a: failed with grpc (boom), passed when run again (1)"]
    assert compare(gloo, grpc) == ["T::b: passes with gloo, failed with grpc: boom"]


@pytest.mark.timeout(900)
def test_torchft_integration_tests_pass_with_grpc_as_with_gloo(
    tmp_path: Path,
) -> None:
    """manager_integ_test.py and local_sgd_integ_test.py of the installed torchft: DDP
    healthy and recovering (one and two ranks per replica), quorum timeout, LocalSGD,
    DiLoCo and streaming DiLoCo recovering, with grpc where they use gloo."""
    out = tmp_path / "outcomes.json"
    command = [sys.executable, str(SUITE / "run.py"), "--json", str(out)]
    proc = subprocess.Popen(
        [*command, "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=840)
    finally:
        if proc.poll() is None:
            # SIGTERM first: the runner then kills the pytest process it runs, which has
            # a session of its own.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, stdout[-8000:]
    outcomes = json.loads(out.read_text())
    passed = {
        backend: sorted(n for n, o in tests.items() if o["result"] == PASSED)
        for backend, tests in outcomes.items()
    }
    # The recovery tests are the point: they must be among what ran and passed.
    for name in (
        "ManagerIntegTest::test_ddp_recovery_0_async_quorum",
        "ManagerIntegTest::test_ddp_recovery_multi_rank",
        "LocalSGDIntegTest::test_diloco_recovery_0",
        "LocalSGDIntegTest::test_streaming_diloco_recovery_0",
    ):
        assert name in passed["grpc"], (name, passed)
    print(stdout)


# ---------------------------------------------------------------- the group on its own


def _store_addr(ctx: RankContext, prefix: str) -> str:
    return f"127.0.0.1:{ctx.store_port}/{prefix}"


def _reconfigure(ctx: RankContext) -> list[float]:
    """Three quorums in a row, each a new group on a new prefix, as torchft's Manager
    makes them; returns how long each configure() took."""
    from torch.distributed import AllreduceOptions

    from torch_grpc_pg.torchft import ProcessGroupGrpc

    pg = ProcessGroupGrpc(timeout=timedelta(seconds=30))
    took = []
    for quorum in range(3):
        start = time.perf_counter()
        pg.configure(
            _store_addr(ctx, f"torchft/{quorum}/0"),
            str(ctx.rank),
            ctx.rank,
            ctx.world_size,
            quorum_id=quorum,
        )
        took.append(time.perf_counter() - start)
        x = torch.full((4,), float(ctx.rank + quorum))
        pg.allreduce([x], AllreduceOptions()).wait()
        expected = sum(r + quorum for r in range(ctx.world_size))
        assert x.tolist() == [float(expected)] * 4, (quorum, x)
        assert pg.errored() is None
    pg.shutdown()
    return took


def test_configure_builds_a_new_group_on_each_prefix_in_bounded_time() -> None:
    results = run_ranks(_reconfigure, 3, timeout_s=180)
    for result in results:
        assert max(result.value) < CONFIGURE_BOUND_S, result.value


def _configure_without_a_peer(ctx: RankContext) -> tuple[float, str]:
    """Rank 2 never comes to the quorum's group: configure() on the others fails within
    the group's timeout, naming it."""
    from torch_grpc_pg.torchft import ProcessGroupGrpc

    if ctx.rank == 2:
        return 0.0, ""
    pg = ProcessGroupGrpc(timeout=timedelta(seconds=3))
    start = time.perf_counter()
    try:
        pg.configure(_store_addr(ctx, "torchft/0/0"), str(ctx.rank), ctx.rank, 3)
    except RuntimeError as exc:
        return time.perf_counter() - start, str(exc)
    return time.perf_counter() - start, "configure() returned"


def test_configure_fails_within_the_timeout_when_a_peer_never_comes() -> None:
    results = run_ranks(_configure_without_a_peer, 3, timeout_s=120)
    for result in results[:2]:
        took, error = result.value
        assert "rank 2 did not publish an address" in error, error
        # The connect timeout (3 s) and the report round after it, with slack for 2 cores.
        assert took < 3 + 5, took


def _lose_a_peer(ctx: RankContext) -> dict[str, object]:
    """Rank 2 dies; ranks 0 and 1 see it in errored() without calling anything, abort in
    bounded time, and go on in a group of two on the next prefix."""
    from torch.distributed import AllreduceOptions

    from torch_grpc_pg.torchft import ProcessGroupGrpc

    pg = ProcessGroupGrpc(timeout=timedelta(seconds=30))
    pg.configure(_store_addr(ctx, "torchft/0/0"), str(ctx.rank), ctx.rank, 3)
    pg.allreduce([torch.ones(4)], AllreduceOptions()).wait()
    if ctx.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    # No op in flight: the broken links alone must fail the group.
    deadline = time.monotonic() + 10
    while pg.errored() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = pg.errored()
    with pytest.raises(RuntimeError):
        pg.allreduce([torch.ones(4)], AllreduceOptions()).wait()
    start = time.perf_counter()
    pg.abort()
    abort_s = time.perf_counter() - start
    after_abort = pg.errored()

    pg.configure(_store_addr(ctx, "torchft/1/0"), str(ctx.rank), ctx.rank, 2)
    x = torch.ones(4)
    pg.allreduce([x], AllreduceOptions()).wait()
    healthy_again = pg.errored()
    pg.shutdown()
    return {
        "seen": str(seen) if seen else None,
        "abort_s": abort_s,
        "after_abort": str(after_abort) if after_abort else None,
        "sum": x.tolist(),
        "healthy_again": healthy_again,
    }


def test_a_dead_peer_shows_in_errored_abort_is_bounded_and_the_next_group_works() -> (
    None
):
    results = run_ranks(_lose_a_peer, 3, timeout_s=180, expected_exitcodes={2: -9})
    survivors = [r.value for r in results if r.rank in (0, 1)]
    assert len(survivors) == 2
    for value in survivors:
        # The first failure, naming the rank that died, before any call noticed it.
        assert value["seen"] and "rank 2" in value["seen"], value
        assert value["abort_s"] < ABORT_BOUND_S, value
        assert value["after_abort"] == value["seen"], value
        assert value["sum"] == [2.0] * 4, value
        assert value["healthy_again"] is None, value


def _baby_ranks(ctx: RankContext) -> dict[int, list[float]]:
    """Both ranks of a ProcessGroupBabyGrpc on threads of one process, each group in a
    subprocess of its own (spawned by torchft)."""
    from torch.distributed import AllreduceOptions

    from torch_grpc_pg.torchft import ProcessGroupBabyGrpc

    results: dict[int, list[float]] = {}

    def rank_main(rank: int) -> None:
        pg = ProcessGroupBabyGrpc(timeout=timedelta(seconds=120))
        try:
            pg.configure(_store_addr(ctx, "baby/0"), str(rank), rank, 2)
            x = torch.full((3,), float(rank + 1))
            pg.allreduce([x], AllreduceOptions()).wait()
            results[rank] = x.tolist()
        finally:
            pg.shutdown()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_the_subprocess_variant_reduces_across_its_subprocesses() -> None:
    (result,) = run_ranks(_baby_ranks, 1, timeout_s=240)
    assert result.value == {0: [3.0] * 3, 1: [3.0] * 3}
