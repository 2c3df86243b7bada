"""Every Python and shell example of README.md and docs/*.md, run as its marker says.

The docs promise that their examples run; this holds them to it, so that an example cannot
drift from the code. How a block is marked, and what each marker does: tests/doc_examples.py.
An example on N ranks runs as N local processes with torchrun's variables; with oracle=gloo it
runs again with the backend "gloo" in place of "grpc", and every rank must print what it
printed under grpc (gloo is the reference the project holds grpc to, not this test's reading).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from doc_examples import Example, MarkerError, doc_pages, extract
from example_runner import (
    ExampleTimeout,
    Outcome,
    Processes,
    background_job,
    base_env,
    job_report,
    run_bash,
    run_python,
)

ROOT = Path(__file__).resolve().parent.parent
PAGES = doc_pages(ROOT)
# The example's own timeout kills it first; this is the backstop (pytest-timeout).
CASE_TIMEOUT_S = 240
# Seconds between two tries of an example that runs during a job.
RETRY_PAUSE_S = 1.0


def _collect() -> tuple[list[Example], list[str]]:
    examples: list[Example] = []
    errors: list[str] = []
    for page in PAGES:
        try:
            examples += extract(page)
        except MarkerError as exc:
            errors.append(str(exc))
    return examples, errors


EXAMPLES, MARKER_ERRORS = _collect()


def test_the_pages_exist_and_hold_examples() -> None:
    missing = [str(p.relative_to(ROOT)) for p in PAGES if not p.exists()]
    assert not missing, f"pages not found: {missing}"
    assert len(EXAMPLES) >= 10, [e.name for e in EXAMPLES]


def test_every_block_has_a_readable_marker() -> None:
    assert not MARKER_ERRORS, "\n".join(MARKER_ERRORS)
    unmarked = [e.name for e in EXAMPLES if e.marker is None]
    assert not unmarked, (
        f"code blocks without a marker: {unmarked}. Put <!-- example: run ... --> or "
        "<!-- example: skip REASON --> on the line above each (tests/doc_examples.py)"
    )


def test_markers_name_jobs_and_files_that_exist() -> None:
    problems = []
    for example in EXAMPLES:
        marker = example.marker
        if marker is None:
            continue
        if marker.during and _job_of(example) is None:
            problems.append(f"{example.name}: during={marker.during}, no such job")
        if marker.verb == "job" and not any(
            e.marker and e.marker.during == marker.job and e.path == example.path
            for e in EXAMPLES
        ):
            problems.append(f"{example.name}: job {marker.job} is never run")
        if (marker.ranks or marker.oracle) and example.language != "python":
            problems.append(f"{example.name}: ranks and oracle are for Python")
    assert not problems, "\n".join(problems)


def _runnable() -> list[Any]:
    params: list[Any] = []
    for example in EXAMPLES:
        marker = example.marker
        if marker is None or marker.verb in ("save", "job"):
            continue  # unmarked: failed above; saved files and jobs serve other blocks
        marks = [pytest.mark.timeout(CASE_TIMEOUT_S)]
        if marker.verb == "skip":
            marks.append(pytest.mark.skip(reason=f"{example.name}: {marker.reason}"))
        params.append(pytest.param(example, id=example.name, marks=marks))
    return params


@pytest.mark.parametrize("example", _runnable())
def test_example(example: Example, tmp_path: Path) -> None:
    marker = example.marker
    assert marker is not None
    _write_page_files(example.path, tmp_path)
    env = base_env(marker.env)
    if example.language == "bash":
        _check_bash(example, tmp_path, env)
        return
    script = tmp_path / (marker.file or "example.py")
    script.write_text(example.code)
    outcomes = run_python(script, marker.ranks, env, marker.timeout, "grpc")
    _assert_succeeded(example, outcomes)
    _assert_expected(example, outcomes)
    if marker.oracle:
        reference = script.with_name(f"reference_{marker.oracle}.py")
        reference.write_text(example.code.replace('"grpc"', f'"{marker.oracle}"'))
        expected = run_python(
            reference, marker.ranks, env, marker.timeout, marker.oracle
        )
        # Only what the ranks printed is compared: gloo itself (torch 2.13) now and then
        # aborts at exit, after the example has printed everything ("terminate called
        # without an active exception"), with or without this package imported.
        assert [o.stdout for o in outcomes] == [o.stdout for o in expected], (
            f"{example.name} printed otherwise under grpc than under {marker.oracle}\n"
            f"grpc:\n{Processes.report(outcomes)}\n{marker.oracle}:\n"
            f"{Processes.report(expected)}"
        )


def _write_page_files(page: Path, workdir: Path) -> None:
    """Every block of the page marked file=NAME, for the blocks that use them."""
    for example in EXAMPLES:
        if example.path == page and example.marker and example.marker.file:
            (workdir / example.marker.file).write_text(example.code)


def _job_of(example: Example) -> Example | None:
    assert example.marker is not None
    return next(
        (
            e
            for e in EXAMPLES
            if e.path == example.path
            and e.marker
            and e.marker.job == example.marker.during
        ),
        None,
    )


def _check_bash(example: Example, workdir: Path, env: dict[str, str]) -> None:
    marker = example.marker
    assert marker is not None
    script = workdir / "example.sh"
    script.write_text(example.code)
    if not marker.during:
        outcome = run_bash(script, env, marker.timeout, "bash")
        _assert_succeeded(example, [outcome])
        _assert_expected(example, [outcome])
        return
    job = _job_of(example)
    assert job is not None and job.marker is not None
    job_script = workdir / (job.marker.file or "job.py")
    job_script.write_text(job.code)
    job_env = base_env(job.marker.env)
    with background_job(job_script, job.marker.ranks, job_env, "job") as found:
        outcome = _retry_until_expected(example, script, {**env, **found})
    assert _passes(example, outcome), (
        f"{example.name} did not print {marker.expect!r} while job "
        f"{marker.during} ran\n{outcome.describe('last try')}\n"
        f"the job:\n{job_report(job_script, 'job')}"
    )


def _retry_until_expected(
    example: Example, script: Path, env: dict[str, str]
) -> Outcome:
    """Runs during a job again and again: what it shows forms while the job runs."""
    assert example.marker is not None
    deadline = time.monotonic() + example.marker.timeout
    attempt = 0
    while True:
        left = deadline - time.monotonic()
        try:
            outcome = run_bash(script, env, max(left, 1.0), f"try{attempt}")
        except ExampleTimeout as exc:
            outcome = Outcome(-1, "", str(exc))
        if _passes(example, outcome) or time.monotonic() + RETRY_PAUSE_S > deadline:
            return outcome
        attempt += 1
        time.sleep(RETRY_PAUSE_S)


def _passes(example: Example, outcome: Outcome) -> bool:
    assert example.marker is not None
    return outcome.returncode == 0 and example.marker.expect in outcome.stdout


def _assert_succeeded(example: Example, outcomes: list[Outcome]) -> None:
    failed = [o for o in outcomes if o.returncode != 0]
    assert not failed, f"{example.name} failed\n{Processes.report(outcomes)}"


def _assert_expected(example: Example, outcomes: list[Outcome]) -> None:
    assert example.marker is not None
    expect = example.marker.expect
    printed = "".join(o.stdout for o in outcomes)
    assert expect in printed, (
        f"{example.name} did not print {expect!r}\n{Processes.report(outcomes)}"
    )
