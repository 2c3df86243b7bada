"""Bandwidth-vs-size and latency-vs-size plots (log-log, one line per backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on benchmark machines
import matplotlib.pyplot as plt
from _report import Row, fmt_bytes
from matplotlib.ticker import FuncFormatter, LogLocator


def plot_collectives(rows: Sequence[Row], out_dir: Path, device: str) -> list[Path]:
    paths: list[Path] = []
    sized = [r for r in rows if r["status"] == "ok" and r["op"] != "barrier"]
    series_keys = dict.fromkeys((r["op"], r["dtype"], r["world"]) for r in sized)
    for op, dtype, world in series_keys:
        group = [
            r for r in sized if (r["op"], r["dtype"], r["world"]) == (op, dtype, world)
        ]
        if len({r["bytes"] for r in group}) < 2:
            continue  # one size is a point, not a curve
        fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
        for backend in dict.fromkeys(r["backend"] for r in group):
            line = sorted(
                (r for r in group if r["backend"] == backend), key=lambda r: r["bytes"]
            )
            sizes = [r["bytes"] for r in line]
            ax_bw.plot(
                sizes, [r["busbw_gbps"] for r in line], marker="o", label=backend
            )
            ax_lat.plot(sizes, [r["lat_us"] for r in line], marker="o", label=backend)
        for ax, ylabel in (
            (ax_bw, "bus bandwidth (GB/s)"),
            (ax_lat, "median latency (us)"),
        ):
            ax.set_xscale("log", base=2)
            # A tick every 16x keeps the byte labels ("256 KiB") from running together.
            ax.xaxis.set_major_locator(LogLocator(base=16))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_bytes(int(x))))
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"{op} {dtype}, world {world}, {device}")
        fig.tight_layout()
        path = out_dir / f"collectives_{device}_{op}_{dtype}_w{world}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
