"""Runs torchft's own integration tests with gloo, then with grpc, and holds grpc to
gloo's results.

    python tests/torchft_suite/run.py                      # both modules, both backends
    python tests/torchft_suite/run.py -k ddp_recovery      # a subset (pytest's -k)
    python tests/torchft_suite/run.py --json out.json      # every outcome

torchft's tests (manager_integ_test.py, local_sgd_integ_test.py in the installed
torchft) run in a pytest process per backend, with swap.py putting the backend's
torchft process group where they build ProcessGroupGloo. Then, per test:

* a test that passes with gloo must pass with grpc (one that fails with grpc runs again,
  alone, up to twice: torchft's quorum timeouts fail a test now and then on a loaded
  machine, with either backend; a pass on a rerun is reported);
* a test that fails with grpc fails the run unless it fails with gloo too;
* a test that built torchft's group under gloo must have built grpc's under grpc,
  configured it as often as it was configured at all, and only grpc's.

Violations are printed, and the exit status is 1; so it is when gloo passes nothing,
since then nothing was compared. pytest's output for each backend is in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BACKENDS = ("gloo", "grpc")
MODULES = ("manager_integ_test.py", "local_sgd_integ_test.py")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
GRPC_GROUP_NAME = "torchft-grpc"
RERUNS = 2
# torchft's slowest test here takes about 6 s on 2 busy cores; its own timeouts are 10 s.
TEST_TIMEOUT_S = 120
RUN_TIMEOUT_S = 600  # one backend's pytest process, all tests

Outcomes = dict[str, dict[str, Any]]


def torchft_dir() -> Path:
    import torchft

    return Path(torchft.__file__).resolve().parent


def run_backend(
    backend: str,
    keyword: str | None,
    out_dir: Path,
    verbose: bool,
    targets: list[str] | None = None,
    label: str = "",
) -> tuple[Outcomes, float]:
    """One pytest process: the modules (or `targets`, test ids) under `backend`."""
    results = out_dir / f"{backend}{label}.json"
    log = out_dir / f"{backend}{label}.log"
    env = {
        **os.environ,
        "TORCHFT_SUITE_BACKEND": backend,
        "TORCHFT_SUITE_RESULTS": str(results),
        # swap.py is imported by name as a plugin.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        *(targets or [str(torchft_dir() / m) for m in MODULES]),
        "-p",
        "swap",
        "-p",
        "no:cacheprovider",
        "-v",  # the log names each test as it starts: a hang shows where
        "-rfE",
        # A hung test fails alone instead of stalling the run (pytest-timeout).
        f"--timeout={TEST_TIMEOUT_S}",
    ]
    if keyword:
        command += ["-k", keyword]
    start = time.monotonic()
    with log.open("w") as log_file:
        # A session of its own: on a timeout, or when this runner is stopped, the whole
        # pytest process goes, threads and ports included (the tests bind fixed ports).
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=out_dir,
            stdout=None if verbose else log_file,
            stderr=None if verbose else subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log_file.write(f"\nkilled after {RUN_TIMEOUT_S} s\n")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    elapsed = time.monotonic() - start
    if not results.exists():
        raise SystemExit(f"{backend}: pytest wrote no results; see {log}")
    return json.loads(results.read_text()), elapsed


def compare(gloo: Outcomes, grpc: Outcomes) -> list[str]:
    """Every way in which grpc falls short of gloo, one line each."""
    violations: list[str] = []
    missing = {"result": SKIPPED, "message": "not collected"}
    for name in sorted(set(gloo) | set(grpc)):
        ours, theirs = grpc.get(name, missing), gloo.get(name, missing)
        if theirs["result"] == PASSED and ours["result"] != PASSED:
            violations.append(
                f"{name}: passes with gloo, {ours['result']} with grpc: {ours['message']}"
            )
        elif ours["result"] == FAILED and theirs["result"] != FAILED:
            violations.append(
                f"{name}: fails with grpc (gloo: {theirs['result']}): {ours['message']}"
            )
        if theirs.get("instances", 0) and not ours.get("instances", 0):
            violations.append(f"{name}: built no grpc process group")
        if theirs.get("configures", 0) and not ours.get("configures", 0):
            violations.append(f"{name}: never configured a grpc process group")
        if ours.get("backends", []) not in ([], [GRPC_GROUP_NAME]):
            violations.append(f"{name}: configured {ours['backends']}, not grpc's")
    if not any(o["result"] == PASSED for o in gloo.values()):
        violations.append("gloo passed no test: nothing was compared")
    return violations


def shortfalls(gloo: Outcomes, grpc: Outcomes) -> list[str]:
    return sorted(
        name
        for name, theirs in gloo.items()
        if theirs["result"] == PASSED
        and grpc.get(name, {}).get("result") == FAILED
        and grpc[name].get("file")
    )


def rerun_shortfalls(
    gloo: Outcomes, grpc: Outcomes, out_dir: Path, verbose: bool
) -> list[str]:
    """torchft's tests that wait on its quorum with a 10 s timeout fail now and then on a
    loaded machine, with gloo as with grpc (test_streaming_diloco_upscale, once in about
    200 runs of it). A test that passes with gloo and fails with grpc runs again, alone,
    up to RERUNS times; one that passes then counts as passed, and is reported."""
    notes = []
    for attempt in range(1, RERUNS + 1):
        names = shortfalls(gloo, grpc)
        if not names:
            break
        targets = [f"{grpc[n]['file']}::{n}" for n in names]
        again, _ = run_backend(
            "grpc", None, out_dir, verbose, targets, label=f"-rerun{attempt}"
        )
        for name in names:
            outcome = again.get(name)
            if outcome and outcome["result"] == PASSED:
                notes.append(
                    f"{name}: failed with grpc ({grpc[name]['message']}), "
                    f"passed when run again ({attempt})"
                )
                grpc[name] = outcome
    return notes


def counts(outcomes: Outcomes) -> str:
    tally = dict.fromkeys((PASSED, FAILED, SKIPPED), 0)
    for outcome in outcomes.values():
        tally[outcome["result"]] += 1
    return ", ".join(f"{n} {r}" for r, n in tally.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--out", type=Path, help="keep pytest's logs here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="torchft-suite-") as temp:
        out_dir = args.out or Path(temp)
        out_dir.mkdir(parents=True, exist_ok=True)
        outcomes: dict[str, Outcomes] = {}
        for backend in BACKENDS:
            outcomes[backend], elapsed = run_backend(
                backend, args.keyword, out_dir, args.verbose
            )
            print(f"{backend}: {counts(outcomes[backend])} in {elapsed:.0f} s")
        for note in rerun_shortfalls(
            outcomes["gloo"], outcomes["grpc"], out_dir, args.verbose
        ):
            print("RERUN", note)
        violations = compare(outcomes["gloo"], outcomes["grpc"])
        if violations and not args.verbose:
            print(f"logs: {out_dir / 'grpc.log'}" if args.out else "")
            print((out_dir / "grpc.log").read_text()[-6000:])
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    for line in violations:
        print("VIOLATION", line)
    if not violations:
        print("every test that passes with gloo passes with grpc")
    return 1 if violations else 0


if __name__ == "__main__":
    # SIGTERM (a test's timeout, make's) ends this process through its finally blocks,
    # which take the running pytest process down with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
