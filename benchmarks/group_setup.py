"""What creating a process group costs: `new_group` and its first collective.

    .venv/bin/python benchmarks/group_setup.py
    .venv/bin/python benchmarks/group_setup.py --world-sizes 2,4,8 --rounds 50
    .venv/bin/python benchmarks/group_setup.py --hosts 2 --rtt 40   # needs root and ip netns

A job pays it for every group it makes: DeviceMesh's dimensions, FSDP and tensor-parallel
subgroups, and torchft, which makes a new group for every quorum. Both backends run in the
same processes (a gloo default group for coordination), alternating round by round, or with
--as-default each as the default group of processes of its own, as a training script has it;
each round times, on every rank, one
`dist.new_group(backend=...)` followed by a 4-byte `all_reduce` on it (the first collective
is where gloo finishes connecting), takes the slowest rank, and destroys the group. The
table gives the median over the rounds with its quartiles, and grpc's median over the
reference backend's.

With --hosts H, the ranks are two per "host" (network namespaces, tests/two_hosts/), H
hosts --rtt ms apart, started by torchrun with the store on the first host, as
benchmarks/two_hosts.py starts them: across a long link, every store request and every
connection's handshake of a rank on another host costs round trips.
"""

from __future__ import annotations

import argparse
import datetime
import json
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _args import parse_ints, parse_list
from _report import (
    Column,
    fmt_num,
    fmt_ratio,
    format_table,
    write_outputs,
)
from _run_start import start_run
from _spawn import RankContext, WorldFailed, run_world

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "two_hosts"))
import launch
from job_runner import JobFailed

from torch_grpc_pg._ports import free_port


def one_setup(ctx: RankContext, backend: str) -> float:
    """Seconds, on the slowest rank, from new_group to the end of its first allreduce."""
    ctx.barrier()
    started = time.perf_counter()
    group = ctx.new_group(backend)
    one = torch.ones(1)
    dist.all_reduce(one, group=group)
    took = time.perf_counter() - started
    if one.item() != ctx.world:  # a wrong result must not pass for a fast one
        raise RuntimeError(
            f"{backend}: first allreduce gave {one.item()}, not {ctx.world}"
        )
    dist.destroy_process_group(group)
    return ctx.max_across([took])[0]


def rank_main(ctx: RankContext) -> None:
    p = ctx.payload
    for backend in p["backends"]:  # the first group of each backend starts its server
        one_setup(ctx, backend)
    times: dict[str, list[float]] = {b: [] for b in p["backends"]}
    for _ in range(p["rounds"]):
        for backend in p["backends"]:
            times[backend].append(one_setup(ctx, backend))
    if ctx.rank == 0:
        for backend, samples in times.items():
            quartiles = statistics.quantiles(samples, n=4)
            ctx.emit(
                "row",
                {
                    "backend": backend,
                    "world": ctx.world,
                    "rounds": len(samples),
                    "median_ms": statistics.median(samples) * 1e3,
                    "q1_ms": quartiles[0] * 1e3,
                    "q3_ms": quartiles[2] * 1e3,
                },
            )


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank of a job across hosts: rank_main's rounds; rank 0 writes the rows."""
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rows: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    payload = {"backends": args.backends, "rounds": args.rounds}
    ctx = RankContext(
        dist.get_rank(),
        dist.get_world_size(),
        torch.device("cpu"),
        payload,
        timeout,
        rows,
    )
    rank_main(ctx)
    dist.destroy_process_group()
    if ctx.rank == 0:
        found = [rows.get()[1] for _ in range(rows.qsize())]
        args.worker_out.write_text(json.dumps(found))


def run_across_hosts(
    args: argparse.Namespace, backends: list[str]
) -> list[dict[str, Any]]:
    """One torchrun job on --hosts namespaces --rtt ms apart; rank 0's rows."""
    if reason := launch.unavailable_reason(args.hosts, args.rtt):
        raise WorldFailed(reason)
    name = launch.unique_name("tgpg-bench")
    with (
        launch.hosts_up(name, args.hosts, args.rtt) as hosts,
        tempfile.TemporaryDirectory(prefix="group-setup-") as tmp,
    ):
        out = Path(tmp) / "rows.json"
        script = [
            str(Path(__file__).resolve()),
            "--worker-out", str(out),
            "--backends", ",".join(backends),
            "--rounds", str(args.rounds),
            "--timeout", str(args.timeout),
        ]  # fmt: skip
        launch.run_on_hosts(
            hosts, script, free_port(), args.timeout, Path(tmp), launch.GLOO_ENV
        )
        return [
            {**row, "hosts": args.hosts, "rtt_ms": args.rtt}
            for row in json.loads(out.read_text())
        ]


def with_ratios(rows: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["world"] == row["world"] and r["backend"] == reference
            ),
            None,
        )
        ratio = row["median_ms"] / base["median_ms"] if base else None
        out.append({**row, "vs_reference": ratio})
    return out


TABLE = [
    Column("hosts", "hosts"),
    Column("rtt ms", "rtt_ms"),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("rounds", "rounds"),
    Column("median ms", "median_ms", fmt_num(1)),
    Column("quartiles ms", "q1_ms", fmt_num(1)),
    Column("", "q3_ms", fmt_num(1)),
    Column("time vs reference", "vs_reference", fmt_ratio),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", type=parse_list, default=None, help="default: grpc,gloo"
    )
    parser.add_argument("--world-sizes", type=parse_ints, default=[2, 4])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--as-default",
        action="store_true",
        help="each backend the default group of its own processes",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="hosts of two ranks each, as network namespaces (2 to 8; needs root)",
    )
    parser.add_argument(
        "--rtt",
        type=int,
        default=0,
        help="round trip between hosts in ms (with --hosts)",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    parser.set_defaults(device="cpu")  # what start_run reads
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2, for the quartiles")
    if args.hosts > 1 and args.as_default:
        parser.error("--hosts runs the backends interleaved only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_out is not None:
        worker(args)
        return 0
    start = start_run(args)
    if start is None:
        return 1
    for note in start.notes:
        print(f"note: {note}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    if args.hosts > 1:
        try:
            rows = run_across_hosts(args, start.backends)
        except (WorldFailed, JobFailed) as exc:
            print(f"error: {args.hosts} hosts: {exc}", file=sys.stderr)
            return 1
    else:
        # Interleaved: every backend in one set of processes. As default: one set each.
        runs = (
            [(b, [b]) for b in start.backends]
            if args.as_default
            else [(start.reference, start.backends)]
        )
        for world in args.world_sizes:
            for default_backend, backends in runs:
                try:
                    run_world(
                        rank_main,
                        world,
                        {"backends": backends, "rounds": args.rounds},
                        lambda kind, data: (
                            rows.append({**data, "hosts": 1, "rtt_ms": 0})
                            if kind == "row"
                            else None
                        ),
                        timeout_s=args.timeout,
                        default_backend=default_backend,
                    )
                except WorldFailed as exc:
                    print(f"error: world {world}: {exc}", file=sys.stderr)
                    return 1
    machine = start.machine
    table = with_ratios(rows, start.reference)
    print(f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['platform']}")
    print(format_table(table, TABLE))
    meta = {**machine, "command": " ".join(sys.argv)}
    name = "group_setup_as_default" if args.as_default else "group_setup"
    if args.hosts > 1:
        name = f"group_setup_{args.hosts}hosts_{args.rtt}ms"
    paths = write_outputs(args.out, name, meta, {"rows": table})
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
