"""Collectives timed the way a training script runs them, beside collectives.py's interleaving.

    .venv/bin/python benchmarks/user_mode.py
    .venv/bin/python benchmarks/user_mode.py --world-sizes 2,4 --rounds 3 --cases allreduce:64M

collectives.py runs every backend in one set of processes (a gloo default group for
coordination, each backend a new_group, one intra-op thread per rank) and interleaves
them sample by sample: the fairest comparison of their costs. A user's script differs:
the backend is the default group, torch keeps its default thread count, and nothing else
lives in the process. Here each (backend, world) gets fresh spawned ranks of its own, set
up like that; the backends take turns, round after round (A B, B A, ...), so that drift of
the machine touches both alike. Each round reports the median time of back-to-back calls
after a warm-up; the summary gives the median over rounds, their range, and the median of
the per-round ratios to the reference backend.

glibc's malloc adapts to what a process frees: once a mapped block of up to 32 MiB has
been freed, blocks up to that size come from the heap and stay there. A script that only calls
collectives never gets there; a training step, whose activations come and go, does at once.
Both backends' speed depends on it, so the default (a plain script) leaves malloc alone and
--warm-malloc frees a 16 MiB tensor in each rank first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _args import parse_ints, parse_size
from _collective_ops import Case, bus_factor, ready_on_default_group
from _report import (
    Column,
    fmt_bytes,
    fmt_num,
    fmt_ratio,
    format_table,
    machine_info,
    write_outputs,
)
from _spawn import RankContext, WorldFailed, run_world

DEFAULT_CASES = "allreduce:64M,broadcast:16M,allreduce:1M"


def parse_cases(text: str) -> list[tuple[str, int]]:
    cases = []
    for item in text.split(","):
        op, _, size = item.partition(":")
        if op not in ("allreduce", "broadcast", "allgather") or not size:
            raise argparse.ArgumentTypeError(
                f"{item!r}: write op:size, e.g. allreduce:64M"
            )
        cases.append((op, parse_size(size)))
    return cases


def user_rank(ctx: RankContext) -> None:
    """One backend as the default group: check, warm up, then time back-to-back calls."""
    p = ctx.payload
    if p["warm_malloc"]:
        # glibc raises its mmap threshold to the size of a freed mapped block (only
        # for blocks of at most 32 MiB) and its trim threshold to twice that: after
        # this, the rank's heap is where a training step that frees a large
        # activation leaves it.
        torch.empty(16 << 20, dtype=torch.uint8).fill_(1)  # freed at once
    for op_name, nbytes in p["cases"]:
        case = Case(op_name, "float32", nbytes, ctx.world, p["backend"])
        op = ready_on_default_group(ctx, case, p["warmup"])
        # Rank 0's first timed call sets how many calls fill --min-time; every rank
        # must make the same number of calls.
        start = time.perf_counter()
        op.run()
        calls = ctx.max_across(
            [max(5.0, p["min_time"] / (time.perf_counter() - start))]
        )
        times = []
        ctx.barrier()
        for _ in range(int(calls[0])):
            start = time.perf_counter()
            op.run()
            times.append(time.perf_counter() - start)
        median, mean = ctx.max_across(
            [statistics.median(times), statistics.fmean(times)]
        )
        if ctx.rank == 0:
            row = {
                "op": op_name,
                "bytes": nbytes,
                "seconds": median,
                "mean_seconds": mean,
            }
            ctx.emit("row", row)


def summarize(rows: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    """Median busbw over rounds per (world, op, bytes, backend), with range and ratio."""
    keyed: dict[tuple[int, str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        keyed.setdefault(
            (row["world"], row["op"], row["bytes"], row["backend"]), []
        ).append(row)
    summary = []
    for (world, op, nbytes, backend), runs in sorted(keyed.items()):
        bws = [nbytes / r["seconds"] / 1e9 * bus_factor(op, world) for r in runs]
        mean_bws = [
            nbytes / r["mean_seconds"] / 1e9 * bus_factor(op, world) for r in runs
        ]
        ref_runs = {
            r["round"]: r["seconds"]
            for r in keyed.get((world, op, nbytes, reference), [])
        }
        ratios = [
            ref_runs[r["round"]] / r["seconds"] for r in runs if r["round"] in ref_runs
        ]
        summary.append(
            {
                "op": op,
                "bytes": nbytes,
                "world": world,
                "backend": backend,
                "rounds": len(runs),
                "busbw_gbps": statistics.median(bws),
                "busbw_min": min(bws),
                "busbw_max": max(bws),
                # Over all calls, outliers included: what a job's throughput sees.
                "mean_busbw_gbps": statistics.median(mean_bws),
                "vs_ref": statistics.median(ratios)
                if backend != reference and ratios
                else None,
                "vs_ref_min": min(ratios) if backend != reference and ratios else None,
                "vs_ref_max": max(ratios) if backend != reference and ratios else None,
            }
        )
    return summary


TABLE = [
    Column("op", "op"),
    Column("size", "bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("rounds", "rounds"),
    Column("busbw GB/s (median)", "busbw_gbps", fmt_num(3)),
    Column("min", "busbw_min", fmt_num(3)),
    Column("max", "busbw_max", fmt_num(3)),
    Column("from mean time", "mean_busbw_gbps", fmt_num(3)),
    Column("/ ref (median)", "vs_ref", fmt_ratio),
    Column("min", "vs_ref_min", fmt_ratio),
    Column("max", "vs_ref_max", fmt_ratio),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", default="grpc,gloo", help="comma list; last: reference"
    )
    parser.add_argument("--world-sizes", type=parse_ints, default=[2])
    parser.add_argument("--cases", type=parse_cases, default=parse_cases(DEFAULT_CASES))
    parser.add_argument(
        "--rounds", type=int, default=3, help="fresh ranks per backend, taking turns"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--min-time", type=float, default=2.0, help="seconds of timed calls per case"
    )
    parser.add_argument(
        "--warm-malloc",
        action="store_true",
        help="free a 16 MiB tensor in each rank first, as a training step would",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backends = args.backends.split(",")
    reference = backends[-1]
    machine = machine_info()
    rows: list[dict[str, Any]] = []
    failed = False
    for world in args.world_sizes:
        for round_ in range(args.rounds):
            order = backends if round_ % 2 == 0 else backends[::-1]
            for backend in order:
                payload = {
                    "backend": backend,
                    "cases": args.cases,
                    "warmup": args.warmup,
                    "min_time": args.min_time,
                    "warm_malloc": args.warm_malloc,
                }

                tag = {"world": world, "backend": backend, "round": round_}

                def on_message(kind: str, data: Any, tag: dict = tag) -> None:
                    if kind == "row":
                        rows.append({**data, **tag})

                try:
                    run_world(
                        user_rank,
                        world,
                        payload,
                        on_message,
                        threads=0,
                        timeout_s=args.timeout,
                        default_backend=backend,
                    )
                except WorldFailed as exc:
                    failed = True
                    print(f"error: {backend}: {exc}", file=sys.stderr)
    summary = summarize(rows, reference)
    print(
        f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['platform']}, torch {machine['torch']}"
    )
    print(
        f"threads per rank: torch's default ({torch.get_num_threads()} in this process)\n"
    )
    print(format_table(summary, TABLE))
    if args.warm_malloc:
        print("each rank freed a 16 MiB tensor before timing (--warm-malloc)")
    meta = {**machine, "command": " ".join(sys.argv), "mode": "user"}
    paths = write_outputs(
        args.out, "user_mode_cpu", meta, {"rows": summary, "runs": rows}
    )
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
