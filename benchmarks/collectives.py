"""Collective latency and bandwidth of "grpc" against gloo (nccl on cuda), same run.

    .venv/bin/python benchmarks/collectives.py --quick
    .venv/bin/python benchmarks/collectives.py --sizes 4:256M --world-sizes 2,4 --plot

For each world size one set of W spawned ranks runs every case. All backends of one
(op, dtype, size) are set up side by side and take turns sample by sample, in alternating
order, so that drift of the machine and bursts of other work hit them alike. The peak-RSS
check of a large allreduce runs in its own ranks per backend, so that no other case's
buffers count against it. Bandwidths follow nccl-tests: algbw = bytes / time; busbw =
algbw * 2(n-1)/n for allreduce, algbw * (n-1)/n for allgather (bytes = the whole output),
algbw for broadcast.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from _args import (
    add_common_args,
    candidate_backend,
    parse_dtypes,
    parse_list,
    parse_sizes,
)
from _backends import backends_for_world
from _collective_ops import (
    OPS,
    Case,
    CollectiveOp,
    actual_bytes,
    bus_factor,
    make_op,
)
from _measure import (
    MiB,
    current_rss_bytes,
    device_sync,
    interleaved_samples,
    memcpy_bandwidth,
    ops_per_sample,
    p90,
    peak_rss_bytes,
    reset_peak_rss,
    sample_count,
    warm_up,
)
from _report import (
    TARGET_TABLE,
    Column,
    Progress,
    Row,
    fmt_bytes,
    fmt_num,
    fmt_ratio,
    format_table,
    other_load_note,
    write_outputs,
)
from _run_start import start_run
from _spawn import RankContext, RankFn, WorldFailed, default_threads, run_world
from _targets import RSS_SLACK, collective_targets


@dataclass(frozen=True)
class RssJob:
    world: int
    backend: str
    nbytes: int


QUICK_CASES: list[tuple[str, str, int, int]] = [
    ("allreduce", "float32", 4, 2),
    ("allreduce", "float32", 1 * MiB, 2),
    ("allreduce", "float32", 64 * MiB, 2),
    ("allreduce", "bfloat16", 64 * MiB, 2),
    ("allreduce", "float16", 64 * MiB, 2),
    ("broadcast", "float32", 16 * MiB, 2),
    ("allgather", "float32", 16 * MiB, 2),
    ("barrier", "-", 0, 2),
    ("allreduce", "float32", 64 * MiB, 4),
]


def plan(args: argparse.Namespace, backends: list[str]) -> list[Case]:
    """Cases in run order: per world, op, dtype and size, every backend back to back."""
    if args.quick:
        specs = [
            s
            for s in QUICK_CASES
            if (args.ops is None or s[0] in args.ops)
            and (args.dtypes is None or s[1] in args.dtypes or s[0] == "barrier")
            and (args.world_sizes is None or s[3] in args.world_sizes)
            and (args.sizes is None or s[2] in args.sizes or s[0] == "barrier")
        ]
    else:
        specs = []
        for world in args.world_sizes or [2]:
            for op in args.ops or OPS:
                if op == "barrier":
                    specs.append((op, "-", 0, world))
                    continue
                for dtype in args.dtypes or ["float32"]:
                    specs += [
                        (op, dtype, size, world)
                        for size in args.sizes or parse_sizes("4:256M")
                    ]
    cases: list[Case] = []
    for op, dtype, size, world in sorted(specs, key=lambda s: s[3]):
        world_backends, _ = backends_for_world(backends, world, args.device)
        for backend in world_backends:
            case = Case(op, dtype, actual_bytes(op, dtype, size, world), world, backend)
            if case not in cases:
                cases.append(case)
    return cases


# ---------------------------------------------------------------- inside the ranks


@dataclass
class _Prepared:
    case: Case
    op: CollectiveOp
    per_sample: int
    sample_s: float  # expected length of one timed sample
    row: Row


def _prepare(ctx: RankContext, case: Case, group: dist.ProcessGroup) -> _Prepared | Row:
    """Allocate, check and warm up one backend's op; a (skipped) row if that fails."""
    row: Row = {"op": case.op, "dtype": case.dtype, "bytes": case.nbytes}
    row.update(world=case.world, backend=case.backend)
    sync = device_sync(ctx.device)
    before = current_rss_bytes()
    reset_peak_rss()
    # The first call doubles as a correctness check, so that a backend returning garbage
    # cannot post a fast time; an unsupported dtype raises here on every rank alike and
    # becomes a skipped row.
    error = ""
    try:
        op = make_op(case, group, ctx.rank, ctx.world, ctx.device)
        op.fill()
        op.run()
        sync()
        if not op.check():
            error = "wrong result"
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not ctx.agree(not error):
        return {**row, "status": f"skipped: {error or 'failed on another rank'}"}
    op.reset()
    estimate = warm_up(ctx, op.run, sync, ctx.payload["warmup"])
    # Growth while only this backend's case was being set up: its tensors and its
    # buffers.
    growth = ctx.max_across([float(peak_rss_bytes() - before)])[0]
    row["rss_growth_mib"] = growth / MiB
    per_sample = ops_per_sample(estimate)
    return _Prepared(case, op, per_sample, estimate * per_sample, row)


def _run_point(
    ctx: RankContext, cases: list[Case], groups: dict[str, dist.ProcessGroup]
) -> list[Row]:
    """Time one (op, dtype, size) on every backend, the backends taking turns."""
    p = ctx.payload
    prepared = [_prepare(ctx, c, groups[c.backend]) for c in cases]
    ready = [x for x in prepared if isinstance(x, _Prepared)]
    sync = device_sync(ctx.device)
    longest = max((x.sample_s for x in ready), default=0.0)
    count = p["iters"] or sample_count(longest, p["min_time"])
    ops = [(x.op.run, x.per_sample) for x in ready]
    timings = interleaved_samples(ctx, ops, sync, count)
    for x, samples in zip(ready, timings):
        median = statistics.median(samples)
        x.row.update(status="ok", lat_us=median * 1e6, lat_p90_us=p90(samples) * 1e6)
        x.row.update(samples=len(samples), ops_per_sample=x.per_sample)
        if x.case.op != "barrier":
            algbw = x.case.nbytes / median / 1e9
            x.row.update(
                algbw_gbps=algbw,
                busbw_gbps=algbw * bus_factor(x.case.op, x.case.world),
            )
    return [x.row if isinstance(x, _Prepared) else x for x in prepared]


def bench_rank(ctx: RankContext) -> None:
    cases: list[Case] = ctx.payload["cases"]
    groups = {b: ctx.new_group(b) for b in dict.fromkeys(c.backend for c in cases)}
    points: dict[tuple[str, str, int], list[Case]] = {}
    for case in cases:
        points.setdefault((case.op, case.dtype, case.nbytes), []).append(case)
    for point in points.values():
        rows = _run_point(ctx, point, groups)
        gc.collect()
        if ctx.rank == 0:
            for row in rows:
                ctx.emit("row", row)


def rss_rank(ctx: RankContext) -> None:
    """Peak RSS of a rank while allreducing one large tensor, above its RSS before."""
    backend, nbytes = ctx.payload["backend"], ctx.payload["bytes"]
    group = ctx.new_group(backend)
    sync = device_sync(ctx.device)
    # Connections and per-peer state belong to the baseline, not to the large op.
    dist.all_reduce(torch.zeros(1024, device=ctx.device), group=group)
    sync()
    gc.collect()
    base = current_rss_bytes()
    # Filled, not empty: untouched pages are not resident, so they would not show in
    # RSS.
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    reset_peak_rss()
    for _ in range(ctx.payload["iters"]):
        dist.all_reduce(t, group=group)
        sync()
    peak = peak_rss_bytes()
    base, peak, over = ctx.max_across([float(base), float(peak), float(peak - base)])
    if ctx.rank == 0:
        key = {"op": "allreduce", "dtype": "float32", "bytes": nbytes}
        row: Row = {**key, "world": ctx.world, "backend": backend, "status": "ok"}
        row.update(rss_base_mib=base / MiB, peak_rss_mib=peak / MiB)
        row.update(peak_over_base_mib=over / MiB, limit_mib=(nbytes + RSS_SLACK) / MiB)
        ctx.emit("row", row)


# ---------------------------------------------------------------- parent


def add_ratios(rows: list[Row], ref: str, memcpy_gbps: dict[int, float]) -> None:
    refs = {
        (r["op"], r["dtype"], r["bytes"], r["world"]): r
        for r in rows
        if r["backend"] == ref and r["status"] == "ok"
    }
    for row in rows:
        if row["status"] != "ok":
            continue
        if "busbw_gbps" in row:
            row["busbw_frac_memcpy"] = row["busbw_gbps"] / memcpy_gbps[row["world"]]
        base = refs.get((row["op"], row["dtype"], row["bytes"], row["world"]))
        if base is None or row["backend"] == ref:
            continue
        row["ratio_lat"] = row["lat_us"] / base["lat_us"]
        if "busbw_gbps" in row:
            row["ratio_bw"] = row["busbw_gbps"] / base["busbw_gbps"]


TABLE = [
    Column("op", "op"),
    Column("dtype", "dtype"),
    Column("size", "bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("lat us", "lat_us", fmt_num(1)),
    Column("p90 us", "lat_p90_us", fmt_num(1)),
    Column("algbw GB/s", "algbw_gbps", fmt_num(3)),
    Column("busbw GB/s", "busbw_gbps", fmt_num(3)),
    Column("busbw/memcpy", "busbw_frac_memcpy", fmt_num(3)),
    Column("bw vs ref", "ratio_bw", fmt_ratio),
    Column("lat vs ref", "ratio_lat", fmt_ratio),
    Column("RSS+ MiB", "rss_growth_mib", fmt_num(0)),
    Column("n", "samples"),
]
RSS_TABLE = [
    Column("size", "bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("base MiB", "rss_base_mib", fmt_num(0)),
    Column("peak MiB", "peak_rss_mib", fmt_num(0)),
    Column("peak-base MiB", "peak_over_base_mib", fmt_num(0)),
    Column("limit MiB", "limit_mib", fmt_num(0)),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="bytes, e.g. 4,1M or 4:256M:4 (default)",
    )
    parser.add_argument(
        "--dtypes", type=parse_dtypes, default=None, help="comma list (default float32)"
    )
    parser.add_argument(
        "--ops", type=parse_list, default=None, help=f"comma list of {','.join(OPS)}"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed calls per case (default 5, quick 3)",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed samples per case (default: time-based)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds of timed samples per case (default 2.0, quick 1.5)",
    )
    parser.add_argument(
        "--rss-size",
        type=parse_sizes,
        default=[256 * MiB],
        help="allreduce size for the RSS check",
    )
    parser.add_argument(
        "--no-rss", action="store_true", help="skip the isolated peak-RSS check"
    )
    parser.add_argument("--plot", action="store_true", help="write PNG plots to --out")
    args = parser.parse_args(argv)
    for op in args.ops or []:
        if op not in OPS:
            parser.error(f"unknown op {op!r}; choose from {OPS}")
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.min_time = (
        args.min_time if args.min_time is not None else (1.5 if args.quick else 2.0)
    )
    return args


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    rss_rows: list[Row] = field(default_factory=list)
    memcpy_gbps: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    failed: bool = False


def run_all(
    args: argparse.Namespace, cases: list[Case], rss_jobs: list[RssJob]
) -> Results:
    """One spawn per world size, then one per RSS job; failures become notes."""
    res = Results()
    progress = Progress(len(cases) + len(rss_jobs), "collectives")

    def collect(into: list[Row]) -> Callable[[str, Any], None]:
        def on_message(kind: str, data: Any) -> None:
            if kind == "row":
                into.append(data)
                size = fmt_bytes(data["bytes"])
                progress.step(f"{data['op']} {size} w{data['world']} {data['backend']}")

        return on_message

    def spawn(fn: RankFn, world: int, payload: Any, into: list[Row]) -> None:
        threads = args.threads_per_rank or default_threads(world)
        try:
            run_world(
                fn, world, payload, collect(into), args.device, threads, args.timeout
            )
        except WorldFailed as exc:
            res.failed = True
            progress.write(f"error: {exc}")
            res.notes.append(str(exc).splitlines()[0])

    timing = {"warmup": args.warmup, "iters": args.iters, "min_time": args.min_time}
    for world in sorted({c.world for c in cases}):
        # Measured with a rank's share of the cores, in the same run as the collectives.
        torch.set_num_threads(args.threads_per_rank or default_threads(world))
        res.memcpy_gbps[world] = memcpy_bandwidth(torch.device(args.device)) / 1e9
        payload = {"cases": [c for c in cases if c.world == world], **timing}
        spawn(bench_rank, world, payload, res.rows)
    for job in rss_jobs:
        payload = {"backend": job.backend, "bytes": job.nbytes, "iters": 3}
        spawn(rss_rank, job.world, payload, res.rss_rows)
    progress.close()
    return res


def print_report(res: Results, targets: list[Row]) -> None:
    print(format_table([r for r in res.rows if r["status"] == "ok"], TABLE))
    if res.rss_rows:
        print("\nPeak RSS of a rank during one allreduce (own ranks per backend):")
        print(format_table(res.rss_rows, RSS_TABLE))
    memcpy = ", ".join(f"world {w}: {v:.2f} GB/s" for w, v in res.memcpy_gbps.items())
    print(f"\nmemcpy bandwidth (256 MiB tensor.copy_, a rank's threads): {memcpy}")
    print("\nTargets:")
    print(format_table(targets, TARGET_TABLE))
    for note in res.notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    start = start_run(args)
    if start is None:
        return 1
    machine, other_load, ref = start.machine, start.other_load, start.reference
    backends, notes = start.backends, start.notes
    cases = plan(args, backends)
    worlds = sorted({c.world for c in cases})
    for world in worlds:
        notes += backends_for_world(backends, world, args.device)[1]
    rss_worlds = [] if args.no_rss else (worlds[:1] if args.quick else worlds)
    rss_jobs = [
        RssJob(w, b, n)
        for w in rss_worlds
        for n in args.rss_size
        for b in backends_for_world(backends, w, args.device)[0]
    ]
    for note in notes:
        print(f"note: {note}", file=sys.stderr)

    res = run_all(args, cases, rss_jobs)
    res.notes[:0] = notes
    add_ratios(res.rows, ref, res.memcpy_gbps)
    candidate = candidate_backend(args.backends, args.device)
    targets = collective_targets(res.rows, res.rss_rows, candidate, ref)
    res.notes += [
        f"{r['backend']} {r['op']} {r['dtype']} {fmt_bytes(r['bytes'])}: {r['status']}"
        for r in res.rows
        if r["status"] != "ok"
    ]
    elapsed = time.monotonic() - started
    machine["during_run"] = other_load.finish()
    if note := other_load_note(machine["during_run"]):
        res.notes.append(note)
    meta = {
        "machine": machine,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "device": args.device,
        "reference_backend": ref,
        "memcpy_gbps_by_world": res.memcpy_gbps,
        "threads_per_rank_by_world": {
            w: args.threads_per_rank or default_threads(w) for w in worlds
        },
        "cases": [asdict(c) for c in cases],
        "notes": res.notes,
        "elapsed_s": elapsed,
    }
    print_report(res, targets)
    tables = {"rows": res.rows, "rss": res.rss_rows, "targets": targets}
    paths = write_outputs(args.out, f"collectives_{args.device}", meta, tables)
    if args.plot:
        from _plot import plot_collectives

        paths += plot_collectives(res.rows, args.out, args.device)
    print(f"\nwrote {', '.join(str(p) for p in paths)} in {elapsed:.0f} s")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
