"""Runs PyTorch's distributed suite under gloo and grpc and holds grpc to gloo's results.

    python tests/conformance/run.py                       # worlds 2, 3 and 4, both backends
    python tests/conformance/run.py -k all_gather         # a subset (pytest's -k)
    python tests/conformance/run.py --json out.json       # every outcome, for docs/conformance.md

For each world size, torch_suite.py runs once per backend in a pytest process
of its own (torch reads the backend and world size when it imports the suite),
with a fresh TEMP_DIR. Then, per upstream test:

* a test that passes under gloo must pass under grpc, unless gates.GLOO_ONLY_TESTS
  names it with the reason grpc cannot (grpc must then skip it, not fail it);
* a test that fails under grpc fails the run, unless it fails under gloo too;
* a test that gates.UNGATED lets run under grpc must pass under gloo where grpc
  runs it, so that the list never runs what gloo itself does not pass (both may
  skip it for the same other reason: a world of 8, GPUs).

Every violation is printed with the upstream test's name, the world size and
grpc's failure, and the exit status is 1. The summary gives passed, failed and
skipped per backend and world, the reasons for grpc's skips, and the accepted
differences. pytest's own output for each configuration is in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gates import GLOO_ONLY_TESTS, UNGATED  # noqa: E402

SUITE = HERE / "torch_suite.py"
BACKENDS = ("gloo", "grpc")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class Outcome:
    result: str  # passed, failed or skipped
    message: str  # why it failed or was skipped; "" when it passed
    seconds: float


EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b")


def _gist(message: str, text: str) -> str:
    """A failure's first line and the last exception it reports (a rank's own)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    raised = [
        line[1:].strip()
        for line in text.splitlines()
        if line.startswith("E ") and EXCEPTION_LINE.match(line[1:].strip())
    ]
    last = raised[-1] if raised else ""
    return first if not last or last == first else f"{first} ... {last}"


def parse_junit(path: Path) -> dict[str, Outcome]:
    """Test name -> outcome, from pytest's JUnit XML."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        seconds = float(case.get("time", "0") or 0)
        result, message = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                result = FAILED
                message = _gist(child.get("message") or "", child.text or "")
                break
            if child.tag == "skipped":
                result = SKIPPED
                message = (child.get("message") or "").strip()
        outcomes[name] = Outcome(result, message, seconds)
    return outcomes


def run_suite(
    backend: str, world: int, keyword: str | None, out_dir: Path, verbose: bool
) -> tuple[dict[str, Outcome], float]:
    """Runs torch_suite.py for one backend and world size; returns outcomes and wall time."""
    junit = out_dir / f"{backend}-world{world}.xml"
    log = out_dir / f"{backend}-world{world}.log"
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as temp_dir:
        # torch's suite keeps its file barrier and lock file here.
        (Path(temp_dir) / "barrier").mkdir()
        env = {
            **os.environ,
            "BACKEND": backend,
            "WORLD_SIZE": str(world),
            "TEMP_DIR": temp_dir,
            # As PyTorch's CI runs the suite "with init file": the tests that
            # re-create the default group (test_barrier_timeout_global) run too.
            "INIT_METHOD": f"file://{temp_dir}/",
            # The suite's file:// rendezvous has no TCP store to find an
            # interface from; every rank is on this host.
            "TORCH_GRPC_PG_BIND_HOST": os.environ.get(
                "TORCH_GRPC_PG_BIND_HOST", "127.0.0.1"
            ),
            "TORCH_GRPC_PG_ADVERTISE_HOST": os.environ.get(
                "TORCH_GRPC_PG_ADVERTISE_HOST", "127.0.0.1"
            ),
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(SUITE),
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfE",
            f"--junitxml={junit}",
        ]
        if keyword:
            command += ["-k", keyword]
        start = time.monotonic()
        with log.open("w") as log_file:
            subprocess.run(
                command,
                env=env,
                cwd=HERE,
                stdout=None if verbose else log_file,
                stderr=subprocess.STDOUT if not verbose else None,
                check=False,
            )
        elapsed = time.monotonic() - start
    if not junit.exists():
        raise SystemExit(
            f"{backend} at world {world}: pytest wrote no results; see {log}"
        )
    return parse_junit(junit), elapsed


@dataclass(frozen=True)
class Finding:
    test: str
    world: int
    text: str

    def __str__(self) -> str:
        return f"{self.test} (world {self.world}): {self.text}"


def compare(
    world: int, gloo: dict[str, Outcome], grpc: dict[str, Outcome]
) -> tuple[list[Finding], list[Finding]]:
    """Returns (violations, accepted differences) for one world size."""
    violations: list[Finding] = []
    accepted: list[Finding] = []
    missing = Outcome(SKIPPED, "not collected", 0.0)
    for name in sorted(set(gloo) | set(grpc)):
        ours, theirs = grpc.get(name, missing), gloo.get(name, missing)
        if theirs.result == PASSED and ours.result != PASSED:
            if name in GLOO_ONLY_TESTS and ours.result == SKIPPED:
                accepted.append(
                    Finding(name, world, f"gloo only: {GLOO_ONLY_TESTS[name]}")
                )
            else:
                violations.append(
                    Finding(
                        name,
                        world,
                        f"passes under gloo, {ours.result} under grpc: {ours.message}",
                    )
                )
        elif ours.result == FAILED and theirs.result == FAILED:
            accepted.append(
                Finding(name, world, f"fails under gloo too: {theirs.message}")
            )
        elif ours.result == FAILED:
            violations.append(
                Finding(
                    name,
                    world,
                    f"fails under grpc (gloo: {theirs.result}): {ours.message}",
                )
            )
        if name in UNGATED and theirs.result != PASSED and ours.result != SKIPPED:
            violations.append(
                Finding(
                    name,
                    world,
                    f"gates.UNGATED runs it under grpc ({ours.result}), but gloo does not "
                    f"pass it ({theirs.result}: {theirs.message})",
                )
            )
    return violations, accepted


def summary_line(
    backend: str, world: int, outcomes: dict[str, Outcome], seconds: float
) -> str:
    counts = Counter(o.result for o in outcomes.values())
    return (
        f"{backend:5} world {world}: {counts[PASSED]} passed, {counts[FAILED]} failed, "
        f"{counts[SKIPPED]} skipped of {len(outcomes)} in {seconds / 60:.1f} min"
    )


def closing_line(grpc: dict[int, dict[str, Outcome]], violations: list[Finding]) -> str:
    """pytest's closing line for grpc over every world; a violation counts as failed."""
    failed = {(v.test, v.world) for v in violations}
    passed = sum(
        o.result == PASSED and (name, world) not in failed
        for world, outcomes in grpc.items()
        for name, o in outcomes.items()
    )
    total = sum(len(outcomes) for outcomes in grpc.values())
    return f"conformance: {passed} passed, {len(failed)} failed, {total - passed - len(failed)} skipped"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: a subset")
    parser.add_argument(
        "--out", type=Path, default=Path("build/conformance"), help="logs and JUnit XML"
    )
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="stream pytest's output"
    )
    args = parser.parse_args()
    # pytest runs from this folder: a relative --out would land under it.
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    outcomes: dict[str, dict[int, dict[str, Outcome]]] = {b: {} for b in BACKENDS}
    lines: list[str] = []
    violations: list[Finding] = []
    accepted: list[Finding] = []
    for world in args.worlds:
        for backend in BACKENDS:
            found, seconds = run_suite(
                backend, world, args.keyword, args.out, args.verbose
            )
            outcomes[backend][world] = found
            lines.append(summary_line(backend, world, found, seconds))
            print(lines[-1], flush=True)
        bad, fine = compare(world, outcomes["gloo"][world], outcomes["grpc"][world])
        violations += bad
        accepted += fine

    if args.json:
        every = {
            f"world{world}": {
                backend: {
                    name: asdict(o)
                    for name, o in sorted(outcomes[backend][world].items())
                }
                for backend in BACKENDS
            }
            for world in args.worlds
        }
        args.json.write_text(json.dumps(every, indent=1) + "\n")
    skips = Counter(
        f"world {world}: {o.message}"
        for world, found in outcomes["grpc"].items()
        for o in found.values()
        if o.result == SKIPPED
    )
    report = [
        "",
        "PyTorch's distributed suite (DistributedTest._DistTestBase):",
        *lines,
    ]
    report += ["", "Skipped under grpc, by reason:"]
    report += [f"  {count:3}  {reason}" for reason, count in sorted(skips.items())]
    if accepted:
        report += ["", "Passed under gloo and not under grpc, accepted:"]
        report += [str(f) for f in accepted]
    if violations:
        report += ["", f"{len(violations)} conformance failures:"]
        report += [str(f) for f in violations]
    else:
        report += [
            "",
            "grpc passes every test that gloo passes but those accepted above",
        ]
    report += ["", closing_line(outcomes["grpc"], violations)]
    print("\n".join(report))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
