"""tests/conformance/run.py: how it judges grpc against gloo, and a subset of
PyTorch's suite through it (make conformance runs all of it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONFORMANCE = Path(__file__).resolve().parent / "conformance"
sys.path.insert(0, str(CONFORMANCE))

import run  # noqa: E402
from gates import GLOO_ONLY_TESTS, UNGATED  # noqa: E402
from run import FAILED, PASSED, SKIPPED, Outcome, compare  # noqa: E402


def _outcome(result: str, message: str = "") -> Outcome:
    return Outcome(result, message, 1.0)


def _violations(gloo: dict[str, Outcome], grpc: dict[str, Outcome]) -> list[str]:
    found, _ = compare(3, gloo, grpc)
    return [str(f) for f in found]


def test_a_test_gloo_passes_must_pass_under_grpc() -> None:
    gloo = {"test_a": _outcome(PASSED), "test_b": _outcome(PASSED)}
    grpc = {
        "test_a": _outcome(SKIPPED, "Test requires backend grpc"),
        "test_b": _outcome(PASSED),
    }
    assert _violations(gloo, grpc) == [
        "test_a (world 3): passes under gloo, skipped under grpc: Test requires backend grpc"
    ]
    grpc["test_a"] = _outcome(FAILED, "RuntimeError: boom")
    assert _violations(gloo, grpc) == [
        "test_a (world 3): passes under gloo, failed under grpc: RuntimeError: boom"
    ]


def test_a_grpc_failure_fails_unless_gloo_fails_too() -> None:
    grpc = {"test_a": _outcome(FAILED, "RuntimeError: boom")}
    assert _violations({"test_a": _outcome(SKIPPED, "no GPU")}, grpc) == [
        "test_a (world 3): fails under grpc (gloo: skipped): RuntimeError: boom"
    ]
    violations, accepted = compare(3, {"test_a": _outcome(FAILED, "env")}, grpc)
    assert not violations
    assert [str(f) for f in accepted] == ["test_a (world 3): fails under gloo too: env"]


def test_gloo_only_tests_are_accepted_when_grpc_skips_them() -> None:
    name = next(iter(GLOO_ONLY_TESTS))
    violations, accepted = compare(
        2, {name: _outcome(PASSED)}, {name: _outcome(SKIPPED, "gloo only")}
    )
    assert not violations and len(accepted) == 1
    # Failing one is not the same as not running it.
    violations, _ = compare(2, {name: _outcome(PASSED)}, {name: _outcome(FAILED, "x")})
    assert len(violations) == 1


def test_an_ungated_test_must_pass_under_gloo_where_grpc_runs_it() -> None:
    name = next(iter(UNGATED))
    found = _violations({name: _outcome(SKIPPED, "no GPU")}, {name: _outcome(PASSED)})
    assert len(found) == 1 and "gates.UNGATED runs it" in found[0], found
    # Both skipping it for the same other reason is fine.
    assert not _violations(
        {name: _outcome(SKIPPED, "no GPU")}, {name: _outcome(SKIPPED, "no GPU")}
    )


def test_closing_line_counts_a_violation_as_failed() -> None:
    grpc = {
        2: {
            "test_a": _outcome(PASSED),
            "test_b": _outcome(SKIPPED),
            "test_c": _outcome(PASSED),
        },
        3: {
            "test_a": _outcome(PASSED),
            "test_b": _outcome(SKIPPED),
            "test_c": _outcome(PASSED),
        },
    }
    violations, _ = compare(3, {"test_b": _outcome(PASSED)}, grpc[3])
    assert (
        run.closing_line(grpc, violations)
        == "conformance: 4 passed, 1 failed, 1 skipped"
    )


def test_parse_junit_reads_pass_fail_and_skip(tmp_path: Path) -> None:
    junit = tmp_path / "results.xml"
    junit.write_text(
        """<testsuites><testsuite>
        <testcase classname="c" name="test_ok" time="1.5"/>
        <testcase classname="c" name="test_skip" time="0.1">
          <skipped message="Need at least 2 CUDA devices"/></testcase>
        <testcase classname="c" name="test_bad" time="2">
          <failure message="RuntimeError: Process 1 exited with error code 10 and exception:">
E   RuntimeError: Process 1 exited with error code 10 and exception:
E   Traceback (most recent call last):
E   ValueError: the rank's own error
          </failure></testcase>
        </testsuite></testsuites>"""
    )
    outcomes = run.parse_junit(junit)
    assert outcomes["test_ok"] == Outcome(PASSED, "", 1.5)
    assert outcomes["test_skip"] == Outcome(
        SKIPPED, "Need at least 2 CUDA devices", 0.1
    )
    assert outcomes["test_bad"].result == FAILED
    assert outcomes["test_bad"].message.endswith("... ValueError: the rank's own error")


@pytest.mark.timeout(600)
def test_subset_of_torch_suite_passes_under_grpc_as_under_gloo(tmp_path: Path) -> None:
    # The calls this project got wrong against torch's own tests, and those the
    # runner ungates or runs with a gloo-named body.
    keyword = " or ".join(
        (
            "test_all_gather_coalesced",
            "test_sparse_all_reduce_sum",
            "test_accumulate_gradients_no_sync_allreduce_hook",
            "test_batch_isend_irecv_gloo_tags",
            "test_monitored_barrier_gloo_subgroup",
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            str(CONFORMANCE / "run.py"),
            "-k",
            keyword,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "conformance: 21 passed, 0 failed, 9 skipped" in result.stdout, result.stdout
