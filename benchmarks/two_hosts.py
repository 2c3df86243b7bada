"""Allreduce bus bandwidth of grpc and gloo between "hosts" over a rate-limited link.

    .venv/bin/python benchmarks/two_hosts.py       # needs root and ip netns; ~22 min
    .venv/bin/python benchmarks/two_hosts.py --hosts 2 --rtts 0 --rates 1gbit,5gbit --sizes 1M,64M
    .venv/bin/python benchmarks/two_hosts.py --hosts 2 --rtts 100 --wire-dtypes "" --connections 2,3,4

By default: 64 MiB at 1 Gbit/s, two and four hosts, each with no delay and 40 ms round
trips, grpc in float32 (in two levels and as a flat ring) and with bfloat16 on the wire, 3
runs each. Each job may take 300 s plus 5 s per ms of round trip (a job of four hosts at
100 ms takes about 300 s, most of it gloo's); --timeout sets another limit.

Network namespaces stand for machines (tests/two_hosts/netns.sh): two on one veth pair,
more on a bridge, and with a round-trip time (--rtts, in ms) behind a hub that holds every
frame for half of it each way (tests/two_hosts/delay_hub.cc). `tc tbf` limits what each
host sends to the given rate. Each run is one `torchrun --nnodes H --nproc-per-node 2` job
across them that times both backends in the same processes, sample by sample in turn
(benchmarks/collectives.py's measurement). With two ranks on each host, a ring allreduce
sends the same bytes over each host's link as over every other hop, so its bus bandwidth
can reach the link rate: the table gives it as a fraction of that rate. Medians over the
runs.

With --wire-dtypes bfloat16 (or float16), grpc also runs with that wire_dtype, as a backend
of its own ("grpc+bfloat16"). With --flat-ring (the default) grpc also runs its allreduce as
one ring over all ranks, as gloo does (two_level=0, "grpc+flat"): the same schedule as gloo's
over grpc's transport. With --connections 4 (the default) grpc also runs with four TCP
connections to each peer on another host (connections_per_peer=4, "grpc+4conn"). After the timings each job counts the bytes every backend
sends over the link (veth0's tx counter in each namespace) for a few allreduces of each
size: the table's "link MB/op" is the most any host sent per allreduce.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "two_hosts"))

import launch
import torch
import torch.distributed as dist
from _args import parse_ints, parse_list, parse_sizes
from _collective_ops import Case, actual_bytes
from _report import (
    Column,
    OtherLoad,
    Row,
    fmt_bytes,
    fmt_num,
    fmt_ratio,
    format_table,
    machine_info,
    other_load_note,
    write_outputs,
)
from _spawn import RankContext
from collectives import _run_point

from torch_grpc_pg._ports import free_port

BACKENDS = ("grpc", "gloo")
REFERENCE = "gloo"
# Allreduces per size whose link traffic is counted.
BYTE_COUNT_OPS = 5
REPO_ROOT = launch.REPO_ROOT


# ---------------------------------------------------------------- inside the ranks


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: every size on both backends; rank 0 writes the rows."""
    warnings.filterwarnings(
        "ignore", category=FutureWarning, module="torch.distributed"
    )
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    # The default group only coordinates (barriers, the slowest rank's times).
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    payload = {"warmup": args.warmup, "iters": None, "min_time": args.min_time}
    ctx = RankContext(rank, world, torch.device("cpu"), payload, timeout, None)
    groups = {b: ctx.new_group(b) for b in BACKENDS}
    # grpc again under other options, each as a backend of its own.
    import torch_grpc_pg

    variants = {
        f"grpc+{wire}": torch_grpc_pg.Options(wire_dtype=wire)
        for wire in args.wire_dtypes
    }
    if args.flat_ring:
        variants["grpc+flat"] = torch_grpc_pg.Options(two_level=False)
    for count in args.connections:
        variants[f"grpc+{count}conn"] = torch_grpc_pg.Options(
            connections_per_peer=count
        )
    for label, options in variants.items():
        group = dist.new_group(backend="grpc", timeout=timeout, pg_options=options)
        assert group is not None
        groups[label] = group
    rows: list[Row] = []
    for size in args.sizes:
        nbytes = actual_bytes("allreduce", "float32", size, world)
        cases = [Case("allreduce", "float32", nbytes, world, b) for b in groups]
        rows += _run_point(ctx, cases, groups)
    for row in rows:
        if row.get("status") == "ok":
            row["link_bytes_per_op"] = _link_bytes_per_op(
                groups[row["backend"]], row["bytes"]
            )
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        args.out.write_text(json.dumps(rows))


def _tx_bytes() -> int:
    """Bytes sent so far out of this namespace's end of the link."""
    return int(Path("/sys/class/net/veth0/statistics/tx_bytes").read_text())


def _link_bytes_per_op(group: dist.ProcessGroup, nbytes: int) -> float:
    """The most either host sent over the link per float32 allreduce of ``nbytes``."""
    t = torch.ones(nbytes // 4)
    dist.all_reduce(t, group=group)  # any first-use setup out of the count
    dist.barrier()
    before = _tx_bytes()
    for _ in range(BYTE_COUNT_OPS):
        dist.all_reduce(t, group=group)
    dist.barrier()
    sent = torch.tensor([float(_tx_bytes() - before)])
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)  # on the gloo default group
    return float(sent) / BYTE_COUNT_OPS


# ---------------------------------------------------------------- parent


def rate_bytes_per_s(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6}
    for suffix, scale in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * scale / 8
    raise ValueError(f"rate {rate!r}: use e.g. 500mbit or 1gbit")


def job_timeout_s(args: argparse.Namespace, rtt_ms: int) -> float:
    """--timeout, or by default 300 s plus 5 s per ms of round trip: on a long link each of
    gloo's ring steps waits a round trip, and a job's time grows with it."""
    return args.timeout if args.timeout is not None else 300.0 + 5.0 * rtt_ms


def run_rate(
    hosts: tuple[launch.Host, ...], rtt_ms: int, rate: str, args: argparse.Namespace
) -> list[Row]:
    """``args.runs`` jobs on the hosts' links shaped to ``rate``; every backend's row of each."""
    launch.netns("shape", launch.set_name(hosts), rate)
    setting = {"hosts": len(hosts), "rtt_ms": rtt_ms, "rate": rate}
    label = f"{len(hosts)} hosts, {rtt_ms} ms, {rate}"
    timeout = job_timeout_s(args, rtt_ms)
    rows: list[Row] = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="two-hosts-bench-") as tmp:
            out = Path(tmp) / "rows.json"
            script = [
                str(Path(__file__).resolve()),
                "--worker",
                "--out", str(out),
                "--sizes", ",".join(map(str, args.sizes)),
                "--warmup", str(args.warmup),
                "--min-time", str(args.min_time),
                "--timeout", str(timeout),
                "--wire-dtypes", ",".join(args.wire_dtypes),
                "--flat-ring" if args.flat_ring else "--no-flat-ring",
                "--connections", ",".join(map(str, args.connections)),
            ]  # fmt: skip
            launch.run_on_hosts(
                hosts, script, free_port(), timeout, Path(tmp), launch.GLOO_ENV
            )
            for row in json.loads(out.read_text()):
                rows.append({**row, **setting, "run": run})
                busbw = row.get("busbw_gbps")
                print(
                    f"{label} run {run + 1}/{args.runs} {fmt_bytes(row['bytes'])} "
                    f"{row['backend']}: {row['status']}"
                    + (f", busbw {busbw:.3f} GB/s" if busbw else ""),
                    file=sys.stderr,
                )
    return rows


def summarize(rows: list[Row]) -> list[Row]:
    """Per setting (hosts, round trip, rate), size and backend: the median over runs,
    as GB/s and as a share of the link."""
    groups: dict[tuple[int, int, str, int, str], list[Row]] = {}
    for row in rows:
        if row["status"] == "ok":
            key = (
                row["hosts"],
                row["rtt_ms"],
                row["rate"],
                row["bytes"],
                row["backend"],
            )
            groups.setdefault(key, []).append(row)
    table: list[Row] = []
    for (hosts, rtt_ms, rate, nbytes, backend), runs in groups.items():
        values = [r["busbw_gbps"] for r in runs]
        median = statistics.median(values)
        table.append(
            {
                "hosts": hosts,
                "rtt_ms": rtt_ms,
                "rate": rate,
                "bytes": nbytes,
                "backend": backend,
                "busbw_gbps": median,
                "lat_ms": statistics.median(r["lat_us"] for r in runs) / 1e3,
                "link_frac": median * 1e9 / rate_bytes_per_s(rate),
                "link_mb": statistics.median(
                    r.get("link_bytes_per_op", float("nan")) for r in runs
                )
                / 1e6,
                "runs": " ".join(f"{v:.3f}" for v in values),
            }
        )

    def point(r: Row) -> tuple[Any, ...]:
        return (r["hosts"], r["rtt_ms"], r["rate"], r["bytes"])

    references = {point(r): r for r in table if r["backend"] == REFERENCE}
    for row in table:
        ref = references.get(point(row))
        if row["backend"] != REFERENCE and ref is not None:
            row["ratio"] = row["busbw_gbps"] / ref["busbw_gbps"]
    return table


TABLE = [
    Column("hosts", "hosts"),
    Column("rtt ms", "rtt_ms"),
    Column("link", "rate"),
    Column("size", "bytes", fmt_bytes),
    Column("backend", "backend"),
    Column("busbw GB/s", "busbw_gbps", fmt_num(3)),
    Column("time ms", "lat_ms", fmt_num(1)),
    Column("link MB/op", "link_mb", fmt_num(1)),
    Column("of link", "link_frac", fmt_num(2)),
    Column("vs gloo", "ratio", fmt_ratio),
    Column("each run", "runs"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=parse_list, default=["1gbit"])
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("64M"))
    parser.add_argument(
        "--hosts", type=parse_ints, default=[2, 4], help="hosts of two ranks (2 to 8)"
    )
    parser.add_argument(
        "--rtts",
        type=parse_ints,
        default=[0, 40],
        help="round-trip times between hosts, in ms (0: a veth pair or a bridge)",
    )
    parser.add_argument("--runs", type=int, default=3, help="jobs per rate")
    parser.add_argument(
        "--wire-dtypes",
        type=parse_list,
        default=["bfloat16"],
        help="also run grpc with each of these wire_dtypes (bfloat16, float16)",
    )
    parser.add_argument(
        "--flat-ring",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run grpc's allreduce as one flat ring (two_level=0)",
    )
    parser.add_argument(
        "--connections",
        type=parse_ints,
        default=[4],
        help="also run grpc with each of these connections_per_peer (K > 1)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--min-time", type=float, default=2.0, help="seconds of samples per size"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per job (default 300 plus 5 per ms of round trip)",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "out")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    for count in args.hosts:
        for rtt_ms in args.rtts:
            if reason := launch.unavailable_reason(count, rtt_ms):
                print(f"two_hosts: {reason}", file=sys.stderr)
                return 1
    for rate in args.rates:
        rate_bytes_per_s(rate)
    machine = {**machine_info(), "kernel": platform.release()}
    other_load = OtherLoad()
    started = time.monotonic()
    rows: list[Row] = []
    for count in args.hosts:
        for rtt_ms in args.rtts:
            name = launch.unique_name("tgpg-bench")
            with launch.hosts_up(name, count, rtt_ms) as hosts:
                for rate in args.rates:
                    rows += run_rate(hosts, rtt_ms, rate, args)
    table = summarize(rows)
    machine["during_run"] = other_load.finish()
    print(format_table(table, TABLE))
    print(f"\n{machine['cpu']}, {machine['cpu_count']} CPUs, Linux {machine['kernel']}")
    print(f"CPUs {machine['cpu_busy_percent']:.0f}% busy before the run")
    if note := other_load_note(machine["during_run"]):
        print(f"note: {note}")
    meta: dict[str, Any] = {
        "machine": machine,
        "args": {k: str(v) for k, v in vars(args).items() if k != "worker"},
        "command": " ".join([os.path.relpath(sys.argv[0], REPO_ROOT), *sys.argv[1:]]),
        "elapsed_s": time.monotonic() - started,
    }
    paths = write_outputs(args.out, "two_hosts", meta, {"rows": rows, "summary": table})
    print(f"wrote {', '.join(str(p) for p in paths)} in {meta['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
