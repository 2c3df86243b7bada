"""The harness itself: results come back, and every way a rank can go wrong
becomes a prompt HarnessError with no process left behind.

No process group here: these tests hold whatever the backend does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from dist_harness import HarnessError, RankContext, run_ranks


def _echo(ctx: RankContext) -> tuple[int, int]:
    return ctx.rank, ctx.world_size


def _hang_with_a_child(ctx: RankContext, pid_dir: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    Path(pid_dir, f"rank{ctx.rank}").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(3600)


def _raise_on_rank1(ctx: RankContext) -> int:
    if ctx.rank == 1:
        raise ValueError(f"boom from rank {ctx.rank}")
    return ctx.rank


def _sigkill_rank1(ctx: RankContext) -> int:
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return ctx.rank


def _never_exit(ctx: RankContext) -> int:
    # A non-daemon thread keeps the interpreter from exiting after the result.
    threading.Thread(target=time.sleep, args=(3600,)).start()
    return ctx.rank


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_results_come_back_in_rank_order() -> None:
    results = run_ranks(_echo, 3)
    assert [res.value for res in results] == [(0, 3), (1, 3), (2, 3)]
    assert [res.exitcode for res in results] == [0, 0, 0]


def test_hang_is_killed_at_the_timeout_with_its_children(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(HarnessError, match="still running after the 8s timeout"):
        run_ranks(_hang_with_a_child, 2, str(tmp_path), timeout_s=8)
    assert time.monotonic() - started < 30
    pids = [int(p) for f in tmp_path.iterdir() for p in f.read_text().split()]
    assert len(pids) == 4, "each rank should have recorded itself and its child"
    assert not [pid for pid in pids if _alive(pid)], "processes outlived the harness"


def test_exception_is_reported_with_its_traceback() -> None:
    with pytest.raises(
        HarnessError, match=r"(?s)rank 1 raised:.*ValueError: boom from rank 1"
    ):
        run_ranks(_raise_on_rank1, 2)


def test_unexpected_death_is_reported() -> None:
    with pytest.raises(HarnessError, match="rank 1 exited without reporting a result"):
        run_ranks(_sigkill_rank1, 2)


def test_expected_death_is_accepted() -> None:
    results = run_ranks(_sigkill_rank1, 2, expected_exitcodes={1: -signal.SIGKILL})
    assert results[0].value == 0
    assert results[1].exitcode == -signal.SIGKILL


def test_rank_that_does_not_exit_is_reported() -> None:
    with pytest.raises(HarnessError, match="did not exit within 3s"):
        run_ranks(_never_exit, 2, exit_grace_s=3)
