"""Run the processes of one job, each logging to a file of its own, and clean up after them.

Shared by the jobs across "hosts" (launch.py's torchrun per network namespace,
tests/fake_hosts.py's process per mount namespace) and by tests/dist_harness.py's
spawned ranks: a job either ends well or fails with the end of each failed process's
log, and leaves nothing running either way.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil


class JobFailed(AssertionError):
    pass


def run_logged(
    commands: Sequence[tuple[Sequence[str], Path]],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    failed_grace_s: float | None = None,
) -> None:
    """Start every ``(command, log)`` at once, its stdout and stderr going to ``log``,
    and wait for all of them.

    JobFailed, with the end of each failed process's log, if any exits non-zero or the
    job outlives ``timeout_s``. With ``failed_grace_s``, once one has failed the others
    get only that long to end on their own (a peer of a failed rank should fail soon,
    not at the job's timeout). Whatever is still running at the end is killed, with
    every process it started.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for command, log in commands:
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        list(command),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=cwd,
                    )
                )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if failed_grace_s is not None and any(
                p.poll() not in (None, 0) for p in procs
            ):
                deadline = min(deadline, time.monotonic() + failed_grace_s)
            time.sleep(0.1)
        failures = [
            f"{log.name}: "
            + ("timed out" if p.poll() is None else f"exit {p.returncode}")
            + f"\n{tail(log)}"
            for p, (_, log) in zip(procs, commands)
            if p.poll() != 0
        ]
        if failures:
            raise JobFailed("\n\n".join(failures))
    finally:
        for proc in procs:
            kill_tree(proc.pid)


def kill_tree(pid: int, timeout_s: float = 30.0) -> None:
    """Kill process ``pid`` and everything it started, and wait for them.

    torchrun starts each worker in a session of its own, so only walking the tree
    reaches them all.
    """
    try:
        root = psutil.Process(pid)
        victims = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for victim in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    psutil.wait_procs(victims, timeout=timeout_s)


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
