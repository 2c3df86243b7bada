"""What users get from torchrun with grpc beyond a plain start: restarts, debug levels.

The scripts live in ``tests/launched/`` and run under torchrun itself, as users run
them. The oracle is exact arithmetic: sums of small integers, and DDP's gradient against
the same gradient on the whole batch in float64.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from example_runner import BIN_DIR, Outcome, Processes, base_env

LAUNCHED = Path(__file__).resolve().parent / "launched"


def _torchrun(
    tmp_path: Path, script: str, args: list[str], env: dict[str, str], timeout: float
) -> tuple[Outcome, Path, float]:
    """``script`` under torchrun in ``tmp_path``; its ranks write into ``outcomes/``."""
    shutil.copy(LAUNCHED / script, tmp_path / script)
    outcomes = tmp_path / "outcomes"
    outcomes.mkdir()
    procs = Processes(tmp_path, "torchrun")
    argv = [str(BIN_DIR / "torchrun"), "--standalone", *args, script]
    started = time.monotonic()
    procs.start(argv, base_env({**env, "OUTCOME_DIR": str(outcomes)}))
    outcome = procs.wait(timeout)[0]
    return outcome, outcomes, time.monotonic() - started


@pytest.mark.parametrize("dies", ("after_allreduce", "before_init"))
def test_torchrun_restarts_the_job_after_a_rank_dies(tmp_path: Path, dies: str) -> None:
    """Three ranks; in the first attempt rank 1 exits without a word, after the first
    allreduce or before it creates its group. torchrun restarts all three on the same
    store, which still holds the first attempt's keys, and the new attempt's groups
    connect and sum exactly.

    After the allreduce, the other two fail their next collective (not at the op
    timeout), unless torchrun stops them first. Before init, the first attempt's group
    was left short of a rank: the second must not read the first one's keys as its own."""
    world = 3
    outcome, outcomes, took = _torchrun(
        tmp_path,
        "restart_after_a_death.py",
        ["--nproc-per-node", str(world), "--max-restarts", "1"],
        {"DIES": dies},
        timeout=180,
    )
    assert outcome.returncode == 0, outcome.describe("torchrun")
    expected_sum = f"sum [{float(world * (world + 1) // 2)}]"
    for rank in range(world):
        lines = (outcomes / f"attempt1-rank{rank}.txt").read_text().split("\n")
        assert lines[:2] == [expected_sum, "done"], (rank, lines)
        if dies == "before_init":
            # torchrun stopped the first attempt's ranks while they waited for rank 1.
            assert not (outcomes / f"attempt0-rank{rank}.txt").exists(), rank
            continue
        lines = (outcomes / f"attempt0-rank{rank}.txt").read_text().split("\n")
        assert lines[0] == expected_sum, (rank, lines)
        # No survivor's barrier completes without rank 1. Its error, if the survivor
        # wrote it before torchrun stopped it, names rank 1 (test_lifecycle.py holds
        # every survivor to that, within a second).
        assert lines[1] != "done", (rank, lines)
        if lines[1]:
            assert lines[1].startswith("error DistBackendError: barrier"), lines
            assert re.search(r"\brank 1\b", lines[1]), lines
    # Neither the op timeout (10 min) nor the connect timeout (60 s) ended an attempt:
    # the whole job (two attempts of three interpreters on 2 cores) takes seconds.
    assert took < 50, f"the job took {took:.0f} s\n{outcome.describe('torchrun')}"


@pytest.mark.parametrize("backend", ("grpc", "cpu:grpc,cuda:gloo"))
def test_torch_distributed_debug_detail(tmp_path: Path, backend: str) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, which users set to find ranks that disagree.

    torch wraps gloo and NCCL in its ProcessGroupWrapper then, which checks each
    collective's shapes on a helper gloo group first. A "grpc" group is a whole
    ProcessGroup of grpc's, which torch leaves as it is: grpc's own check of every
    collective reports the disagreement, naming both ranks. With a mixed backend
    string torch wraps grpc's backend as it wraps gloo's, and the wrapper reports it.
    """
    world = 2
    outcome, outcomes, _ = _torchrun(
        tmp_path,
        "debug_detail.py",
        ["--nproc-per-node", str(world)],
        {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "BACKEND": backend},
        timeout=120,
    )
    assert outcome.returncode == 0, outcome.describe("torchrun")
    wrapped = backend != "grpc"
    for rank in range(world):
        seen = json.loads((outcomes / f"rank{rank}.json").read_text())
        assert seen["debug_level"].endswith("DETAIL"), seen
        assert seen["cpu_backend"] == (
            "_ProcessGroupWrapper" if wrapped else "ProcessGroupGrpc"
        ), seen
        assert seen["all_reduce"] == [1.0, 3.0, 5.0, 7.0], seen
        assert seen["all_gather"] == [[0.0, 0.0], [1.0, 1.0]], seen
        assert seen["ddp_grad"] == pytest.approx(seen["reference_grad"], rel=1e-5), seen
        mismatch = seen["mismatch"]
        assert mismatch is not None, seen
        if wrapped:
            assert "Detected mismatch between collectives on ranks" in mismatch, seen
            assert f"TensorShape=[{3 + rank}]" in mismatch, seen
            continue
        other = 1 - rank
        assert mismatch.startswith("DistBackendError: allreduce"), seen
        assert f"(float32, {3 + rank} elements, SUM) on rank {rank}" in mismatch
        assert f"rank {other}, which is running allreduce" in mismatch
        assert f"{3 + other} elements" in mismatch, seen
