"""What several streams per peer would buy: one allreduce split over K groups at once.

    .venv/bin/python benchmarks/streams_per_peer.py
    TORCH_GRPC_PG_UNIX_SOCKETS=0 .venv/bin/python benchmarks/streams_per_peer.py   # TCP links

A grpc group has one HTTP/2 stream to each peer, and gRPC lets one write per stream be in
flight, so a transport could open several streams per peer and spread a collective's chunks
over them. Before building that, this measures what it could gain at most: each of K
process groups of a backend has streams of its own, so K async allreduces of 1/K of the
tensor, one on each group, keep K writes per peer in flight, with no reordering to pay
for. K = 1 is the plain allreduce. Both backends run in the same processes, every
(backend, K) interleaved sample by sample (benchmarks/collectives.py's measurement);
the table gives bus bandwidth and the gain over K = 1 of the same backend.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _args import parse_ints, parse_list, parse_size
from _collective_ops import bus_factor
from _measure import (
    Op,
    interleaved_samples,
    ops_per_sample,
    sample_count,
    warm_up,
)
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


def split_allreduce(tensor: torch.Tensor, groups: list[dist.ProcessGroup]) -> Op:
    """An op that allreduces the tensor as len(groups) parts at once, one per group."""
    parts = list(tensor.chunk(len(groups)))

    def op() -> None:
        works = [
            dist.all_reduce(part, group=group, async_op=True)
            for part, group in zip(parts, groups)
        ]
        for work in works:
            work.wait()

    return op


def rank_main(ctx: RankContext) -> None:
    p = ctx.payload
    elements = p["bytes"] // 4
    plans = [(b, k) for b in p["backends"] for k in p["streams"]]
    groups = [[ctx.new_group(backend) for _ in range(k)] for backend, k in plans]
    # Ones summed over the world, on every plan's groups: a wrong result must not
    # pass for a fast one.
    for (backend, k), plan_groups in zip(plans, groups):
        check = torch.ones(elements, dtype=torch.float32)
        split_allreduce(check, plan_groups)()
        if not torch.equal(check, torch.full_like(check, float(ctx.world))):
            raise RuntimeError(f"{backend} over {k} groups: wrong allreduce result")
    ops = [split_allreduce(torch.ones(elements), g) for g in groups]
    estimates = [warm_up(ctx, op, lambda: None, p["warmup"]) for op in ops]
    per_sample = [ops_per_sample(e) for e in estimates]
    longest = max(e * n for e, n in zip(estimates, per_sample))
    count = sample_count(longest, p["min_time"])
    samples = interleaved_samples(ctx, list(zip(ops, per_sample)), lambda: None, count)
    if ctx.rank == 0:
        for (backend, k), times in zip(plans, samples):
            ctx.emit(
                "row",
                {
                    "backend": backend,
                    "streams": k,
                    "median_s": statistics.median(times),
                },
            )


def summarize(
    rows: list[dict[str, Any]], nbytes: int, world: int
) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        busbw = nbytes * bus_factor("allreduce", world) / row["median_s"] / 1e9
        out.append({**row, "bytes": nbytes, "world": world, "busbw_gbps": busbw})
    for row in out:
        base = next(
            r for r in out if r["backend"] == row["backend"] and r["streams"] == 1
        )
        row["gain"] = row["busbw_gbps"] / base["busbw_gbps"]
    return out


TABLE = [
    Column("size", "bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("groups (streams per peer)", "streams"),
    Column("busbw GB/s", "busbw_gbps", fmt_num(3)),
    Column("vs 1 group", "gain", fmt_ratio),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", type=parse_list, default=["grpc", "gloo"])
    parser.add_argument("--streams", type=parse_ints, default=[1, 2, 4])
    parser.add_argument("--size", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per point")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    args = parser.parse_args(argv)
    if 1 not in args.streams:
        parser.error(
            "--streams must include 1, the plain allreduce the others are compared with"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    payload = {
        "backends": args.backends,
        "streams": args.streams,
        "bytes": args.size,
        "warmup": args.warmup,
        "min_time": args.min_time,
    }
    # Taken before the run, so that it tells whether other work was using the CPUs.
    machine = machine_info()
    rows: list[dict[str, Any]] = []
    try:
        run_world(
            rank_main,
            args.world,
            payload,
            lambda kind, data: rows.append(data) if kind == "row" else None,
            timeout_s=args.timeout,
        )
    except WorldFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    table = summarize(rows, args.size, args.world)
    print(f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['platform']}")
    print(format_table(table, TABLE))
    meta = {**machine, "command": " ".join(sys.argv)}
    paths = write_outputs(args.out, "streams_per_peer", meta, {"rows": table})
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
