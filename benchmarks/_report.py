"""Tables, JSON/CSV output, the machine's description and a progress bar."""

from __future__ import annotations

import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

Row = dict[str, Any]


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    fmt: Callable[[Any], str] = str


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return (
                f"{n // scale} {unit}" if n % scale == 0 else f"{n / scale:.3g} {unit}"
            )
    return f"{n} B"


def fmt_num(digits: int) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        if value is None or value == "":
            return "-"
        if isinstance(value, float):
            return f"{value:.{digits}f}"
        return str(value)

    return fmt


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# The verdict table both benchmark scripts print at the end.
TARGET_TABLE = [
    Column("target", "target"),
    Column("value", "value", fmt_num(2)),
    Column("goal", "goal"),
    Column("", "result"),
]


def format_table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
    cells = [[c.header for c in columns]] + [
        [c.fmt(row.get(c.key)) for c in columns] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit() -> str | None:
    """The commit under test, marked when tracked files differ from it."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+uncommitted"
    return commit


def _extension_built() -> str | None:
    """When the checkout's grpc extension was built: commits can land after a build."""
    built = sorted(
        (Path(__file__).resolve().parent.parent / "torch_grpc_pg").glob("_C*.so")
    )
    if not built:
        return None
    return time.strftime(
        "%Y-%m-%dT%H:%M:%S%z", time.localtime(built[-1].stat().st_mtime)
    )


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "git_commit": _git_commit(),
        "grpc_extension_built": _extension_built(),
        # Other work on the machine skews every number; this says whether there was some.
        # (The load average would also count the ranks of a benchmark that just ended.)
        "cpu_busy_percent": psutil.cpu_percent(interval=0.5),
    }
    if torch.cuda.is_available():
        info["gpus"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
    return info


def busy_note(cpu_busy_percent: float) -> str | None:
    """A warning when other work is using the CPUs: it skews every number of the run."""
    if cpu_busy_percent < 20:
        return None
    return (
        f"the CPUs were {cpu_busy_percent:.0f}% busy before the run: "
        "numbers will be noisy"
    )


class OtherLoad:
    """CPU time that processes other than this benchmark used while it ran.

    The machine's busy time minus this process's and its reaped children's (the ranks).
    """

    def __init__(self) -> None:
        self._start = self._sample()
        self._wall = time.monotonic()

    @staticmethod
    def _sample() -> tuple[float, float]:
        t = psutil.cpu_times()
        # Only time charged to processes: softirq time is mostly the kernel moving the
        # ranks' own loopback traffic, and is not charged to them.
        busy = t.user + t.system + getattr(t, "nice", 0.0)
        mine = resource.getrusage(resource.RUSAGE_SELF)
        ranks = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = mine.ru_utime + mine.ru_stime + ranks.ru_utime + ranks.ru_stime
        return busy, own

    def finish(self) -> dict[str, float]:
        busy, own = self._sample()
        other = max(0.0, (busy - self._start[0]) - (own - self._start[1]))
        capacity = (time.monotonic() - self._wall) * (os.cpu_count() or 1)
        return {"other_cpu_s": other, "other_cpu_share": other / max(capacity, 1e-9)}


def other_load_note(load: dict[str, float]) -> str | None:
    if load["other_cpu_share"] < 0.05:
        return None
    return (
        f"other processes used {load['other_cpu_share']:.0%} of the CPUs during the run "
        f"({load['other_cpu_s']:.0f} CPU-s): numbers are skewed"
    )


def write_outputs(
    out_dir: Path, stem: str, meta: dict[str, Any], tables: dict[str, Sequence[Row]]
) -> list[Path]:
    """One JSON with every table; one CSV per table (`stem.csv`, else `stem_<name>.csv`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    body = {"meta": meta, **{name: list(rows) for name, rows in tables.items()}}
    json_path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    paths = [json_path]
    for name, rows in tables.items():
        csv_path = out_dir / (f"{stem}.csv" if name == "rows" else f"{stem}_{name}.csv")
        keys: list[str] = []
        for row in rows:
            keys += [k for k in row if k not in keys]
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        paths.append(csv_path)
    return paths


class Progress:
    """tqdm when it is installed, else a one-line counter on stderr."""

    def __init__(self, total: int, desc: str) -> None:
        self._done = 0
        self._total = total
        self._desc = desc
        self._start = time.monotonic()
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar: Any = None
        else:
            self._bar = tqdm(
                total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False
            )

    def step(self, label: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
            return
        elapsed = time.monotonic() - self._start
        sys.stderr.write(
            f"\r{self._desc} {self._done}/{self._total} [{elapsed:.0f}s] {label:<48}"
        )
        sys.stderr.flush()

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            sys.stderr.write(f"\r{message}\n")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")
