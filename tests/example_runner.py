"""Runs one documentation example as a user would: a script on N local ranks, or bash.

Ranks get the variables torchrun gives them (env:// rendezvous on a free loopback port,
hosted by rank 0's TCPStore), and nothing of this process's TORCH_GRPC_PG_* settings, so
an example sees the defaults the docs describe. Each process starts a session of its own
and the whole session is killed when the example ends or runs out of time: nothing an
example starts (a torchrun, a hung rank) outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from torch_grpc_pg._ports import LOOPBACK, free_port

# The interpreter, torchrun and the status tool of the environment running the tests.
BIN_DIR = Path(sys.executable).parent
# What torchrun gives a rank; only the ranks of an example get them, from rank_env.
LAUNCHER_VARIABLES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
    }
)


@dataclass(frozen=True)
class Outcome:
    """What one process of an example did."""

    returncode: int
    stdout: str
    stderr: str

    def describe(self, who: str) -> str:
        return (
            f"--- {who}: exit {self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


class ExampleTimeout(AssertionError):
    """An example ran past its time; the message holds what it printed so far."""


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of an example: ours without the backend's settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TORCH_GRPC_PG_") and k not in LAUNCHER_VARIABLES
    }
    env["PATH"] = os.pathsep.join([str(BIN_DIR), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"  # as torchrun sets it; 2 cores serve every rank
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def rank_env(
    env: Mapping[str, str], rank: int, world: int, port: int
) -> dict[str, str]:
    return {
        **env,
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
    }


class Processes:
    """Processes started together, their output kept in files (no pipe can fill up)."""

    def __init__(self, workdir: Path, tag: str) -> None:
        self.workdir = workdir
        self.tag = tag
        self.procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []

    def start(self, argv: list[str], env: Mapping[str, str]) -> None:
        index = len(self.procs)
        out = self.workdir / f".{self.tag}-{index}.out"
        err = self.workdir / f".{self.tag}-{index}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        self.procs.append((proc, out, err))

    def wait(self, timeout: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        for proc, _, _ in self.procs:
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                self.kill()
                raise ExampleTimeout(
                    f"the example ran past {timeout:.0f} s and was killed\n"
                    + self.report(self.outcomes())
                ) from None
        return self.outcomes()

    def outcomes(self) -> list[Outcome]:
        return [
            Outcome(
                proc.returncode if proc.returncode is not None else -1,
                out.read_text(errors="replace"),
                err.read_text(errors="replace"),
            )
            for proc, out, err in self.procs
        ]

    def kill(self) -> None:
        for proc, _, _ in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @staticmethod
    def report(outcomes: list[Outcome]) -> str:
        return "\n".join(o.describe(f"process {i}") for i, o in enumerate(outcomes))


def run_python(
    script: Path, ranks: int, env: Mapping[str, str], timeout: float, tag: str
) -> list[Outcome]:
    """`script` in one plain process (ranks=0) or on `ranks` local ranks."""
    procs = Processes(script.parent, tag)
    argv = [sys.executable, script.name]
    if ranks == 0:
        procs.start(argv, env)
    else:
        port = free_port()
        for rank in range(ranks):
            procs.start(argv, rank_env(env, rank, ranks, port))
    return procs.wait(timeout)


def run_bash(script: Path, env: Mapping[str, str], timeout: float, tag: str) -> Outcome:
    procs = Processes(script.parent, tag)
    procs.start(["bash", "-euo", "pipefail", script.name], env)
    return procs.wait(timeout)[0]


@contextlib.contextmanager
def background_job(
    script: Path, ranks: int, env: Mapping[str, str], tag: str
) -> Iterator[dict[str, str]]:
    """`script` on `ranks` ranks for as long as the block runs; yields the variables that
    find its store (MASTER_ADDR, MASTER_PORT), and kills every rank at the end."""
    procs = Processes(script.parent, tag)
    port = free_port()
    try:
        for rank in range(ranks):
            procs.start([sys.executable, script.name], rank_env(env, rank, ranks, port))
        yield {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)}
    finally:
        procs.kill()


def job_report(script: Path, tag: str) -> str:
    """What a background job's ranks printed, for a failure message."""
    parts = []
    for out in sorted(script.parent.glob(f".{tag}-*.out")):
        err = out.with_suffix(".err")
        parts.append(
            f"--- {out.stem}\n{out.read_text(errors='replace')}"
            f"{err.read_text(errors='replace') if err.exists() else ''}"
        )
    return "\n".join(parts)
