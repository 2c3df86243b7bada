"""Print RESULTS.md's target tables as Markdown, from the JSON the benchmarks wrote.

    .venv/bin/python benchmarks/summarize.py [--out benchmarks/out] [--device cpu]

Paste the output into benchmarks/RESULTS.md: numbers are copied, never retyped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _args import reference_backend
from _report import Row, fmt_bytes
from _targets import HALF_DTYPES, MiB, allreduce_64mib, find_row


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _cell(row: Row | None, key: str, fmt: str) -> str:
    return "TODO" if row is None or row.get(key) is None else format(row[key], fmt)


def _ratio(a: Row | None, b: Row | None, key: str) -> str:
    if a is None or b is None:
        return "TODO"
    return f"{a[key] / b[key]:.2f}x"


def _table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def collectives(data: dict[str, Any], cand: str, ref: str) -> str:
    rows = data["rows"]
    parts: list[str] = []

    def bw_table(cases: Sequence[tuple[str, int, int]]) -> str:
        lines = []
        for op, nbytes, world in cases:
            key = {"op": op, "dtype": "float32", "bytes": nbytes, "world": world}
            r, c = (
                find_row(rows, backend=ref, **key),
                find_row(rows, backend=cand, **key),
            )
            cells = [_cell(r, "busbw_gbps", ".3f"), _cell(c, "busbw_gbps", ".3f")]
            ratio = _ratio(c, r, "busbw_gbps")
            lines.append([op, fmt_bytes(nbytes), str(world), *cells, ratio, "≥ 1.00x"])
        head = ["op", "size", "world", f"{ref} busbw GB/s", f"{cand} busbw GB/s"]
        return _table([*head, f"{cand}/{ref}", "goal"], lines)

    parts.append("#### allreduce float32 64 MiB, bus bandwidth\n")
    parts.append(bw_table([("allreduce", 64 * MiB, 2), ("allreduce", 64 * MiB, 4)]))
    parts.append("\n#### allreduce float32 1 MiB, bus bandwidth\n")
    parts.append(bw_table([("allreduce", 1 * MiB, 2)]))
    key = {"op": "allreduce", "dtype": "float32", "bytes": 4, "world": 2}
    r, c = find_row(rows, backend=ref, **key), find_row(rows, backend=cand, **key)
    parts.append("\n#### allreduce float32 4 B, median latency\n")
    line = [
        _cell(r, "lat_us", ".1f"),
        _cell(c, "lat_us", ".1f"),
        _ratio(c, r, "lat_us"),
    ]
    head = [f"{ref} µs", f"{cand} µs", f"{cand}/{ref}", "goal"]
    parts.append(_table(head, [[*line, "≤ 1.00x"]]))
    parts.append("\n#### broadcast and allgather float32 16 MiB, bus bandwidth\n")
    parts.append(bw_table([("broadcast", 16 * MiB, 2), ("allgather", 16 * MiB, 2)]))

    parts.append("\n#### Peak RSS of a rank during a 256 MiB allreduce (world 2)\n")
    lines = []
    for backend in (ref, cand):
        rr = find_row(data.get("rss", []), backend=backend, world=2)
        cells = [_cell(rr, k, ".0f") for k in ("rss_base_mib", "peak_rss_mib")]
        cells += [_cell(rr, "peak_over_base_mib", ".0f"), _cell(rr, "limit_mib", ".0f")]
        lines.append([backend, *cells])
    head = ["backend", "baseline MiB", "peak MiB", "peak - baseline MiB", "goal ≤ MiB"]
    parts.append(_table(head, lines))

    parts.append(
        "\n#### bfloat16 / float16 allreduce 64 MiB time vs float32 (world 2)\n"
    )
    lines = []
    for backend in (cand, ref):
        f32 = allreduce_64mib(rows, backend, "float32")
        for dtype in HALF_DTYPES:
            half = allreduce_64mib(rows, backend, dtype)
            goal = "≤ 1.20x" if backend == cand else "(reference)"
            cells = [_cell(f32, "lat_us", ".0f"), _cell(half, "lat_us", ".0f")]
            lines.append([backend, dtype, *cells, _ratio(half, f32, "lat_us"), goal])
    head = ["backend", "dtype", "float32 µs", "dtype µs", "dtype/float32", "goal"]
    parts.append(_table(head, lines))
    memcpy = data["meta"].get("memcpy_gbps_by_world", {})
    parts.append(
        "\nmemcpy bandwidth (256 MiB tensor.copy_, one rank's threads): "
        + ", ".join(f"world {w}: {v:.2f} GB/s" for w, v in memcpy.items())
    )
    return "\n".join(parts)


def ddp(data: dict[str, Any], cand: str, ref: str) -> str:
    rows = data["rows"]
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        r, c = (
            find_row(rows, backend=ref, model=model),
            find_row(rows, backend=cand, model=model),
        )
        cells = [_cell(r, "step_ms", ".1f"), _cell(c, "step_ms", ".1f")]
        cells += [_cell(r, "samples_per_s", ".0f"), _cell(c, "samples_per_s", ".0f")]
        lines.append([model, *cells, _ratio(c, r, "step_ms"), "≤ 1.05x"])
    head = ["model", f"{ref} step ms", f"{cand} step ms", f"{ref} samples/s"]
    head += [f"{cand} samples/s", f"{cand}/{ref} step time", "goal"]
    return "#### DDP step time (world 2)\n\n" + _table(head, lines)


def verdicts(*runs: dict[str, Any] | None) -> str:
    """The targets as the benchmarks judged them, one line each."""
    lines = [
        [t["target"], t["value"] or "TODO", t["goal"], t["result"]]
        for run in runs
        if run is not None
        for t in run.get("targets", [])
    ]
    return "#### Summary\n\n" + _table(["target", "value", "goal", "result"], lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--candidate", default="grpc")
    args = parser.parse_args()
    ref = reference_backend(args.device)
    coll = _load(args.out / f"collectives_{args.device}.json")
    steps = _load(args.out / f"ddp_step_{args.device}.json")
    print(verdicts(coll, steps) + "\n")
    if coll is not None:
        print(collectives(coll, args.candidate, ref) + "\n")
    if steps is not None:
        print(ddp(steps, args.candidate, ref))


if __name__ == "__main__":
    main()
