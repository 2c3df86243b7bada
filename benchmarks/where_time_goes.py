"""Where a rank's time goes during one collective: CPU time per thread, context switches, faults.

    .venv/bin/python benchmarks/where_time_goes.py
    .venv/bin/python benchmarks/where_time_goes.py --op broadcast --size 16M --world 4
    .venv/bin/python benchmarks/where_time_goes.py --idle 5 --size 4 --world 4

Each backend runs as the default group of its own spawned ranks (as in user_mode.py).
Around a run of back-to-back calls, every rank reads its threads' counters from /proc
(user and system CPU time, voluntary and involuntary context switches) and its minor page
faults, and reports the differences per call; threads are grouped by name. For grpc it also
gives them per chunk (chunk_bytes), the unit in which the transport hands data from the
thread that reads a stream to the thread that runs the collective.

With --idle S the ranks instead sleep for S seconds after the warm-up, and the same
counters are given per second: what a group costs a process that holds it between steps
(threads that wake, CPU they use).

For the kernel and library functions behind the CPU time, run perf alongside, e.g.

    perf record -a -g -- sleep 4    # while this script times one backend
    perf report --no-children --sort comm,dso,sym
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import defaultdict
from typing import Any

import torch
from _args import parse_size
from _collective_ops import Case, ready_on_default_group
from _report import machine_info
from _spawn import RankContext, WorldFailed, run_world

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_counters() -> dict[str, list[float]]:
    """Per thread name: [cpu s, voluntary switches, involuntary switches, faults, threads]."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/status") as f:
                status = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        # Pool threads carry numbers ("grpc_global_tim", "pt_gloo_runloop0"): group them.
        name = re.sub(r"[-_]?\d+$", "", name)
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        voluntary = int(
            re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1]
        )
        forced = int(
            re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M)[1]
        )
        entry = totals[name]
        entry[0] += cpu
        entry[1] += voluntary
        entry[2] += forced
        entry[3] += int(fields[7])  # minflt
        entry[4] += 1
    return dict(totals)


def minor_faults() -> int:
    with open("/proc/self/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2 :].split()[7])


def profile_rank(ctx: RankContext) -> None:
    p = ctx.payload
    case = Case(p["op"], "float32", p["bytes"], ctx.world, p["backend"])
    op = ready_on_default_group(ctx, case, warmup=3)
    ctx.barrier()
    before, faults, start = thread_counters(), minor_faults(), time.perf_counter()
    if p["idle_s"]:
        time.sleep(p["idle_s"])
    else:
        for _ in range(p["calls"]):
            op.run()
    elapsed = time.perf_counter() - start
    after, faults = thread_counters(), minor_faults() - faults
    threads = {
        name: [a - before.get(name, [0.0] * 5)[i] for i, a in enumerate(values[:4])]
        + [values[4]]
        for name, values in after.items()
    }
    ctx.emit(
        "rank",
        {"rank": ctx.rank, "elapsed": elapsed, "faults": faults, "threads": threads},
    )


def report(backend: str, args: argparse.Namespace, ranks: list[dict[str, Any]]) -> None:
    # Counters are given per call, or per second when idle.
    per = args.idle or args.calls
    unit = "s" if args.idle else "call"
    if args.idle:
        print(
            f"\n{backend}: idle for {args.idle:g} s after {args.op} {args.size} B, world {args.world}"
        )
    else:
        elapsed = max(r["elapsed"] for r in ranks) / per
        print(
            f"\n{backend}: {args.op} {args.size} B, world {args.world}: {elapsed * 1e3:.1f} ms per call"
        )
    chunks = None
    if backend == "grpc" and not args.idle:
        # Chunks a rank receives per call: the ring's 2(W-1)/W of the buffer for
        # allreduce, the whole buffer for broadcast.
        share = 2 * (args.world - 1) / args.world if args.op == "allreduce" else 1.0
        chunks = max(1.0, args.size * share / args.chunk_bytes)
        print(
            f"  about {chunks:.0f} chunks of {args.chunk_bytes} B received per rank and call"
        )
    header = (
        f"  {'rank':>4}  {'thread':<18} {'n':>2} {'CPU ms/' + unit:>11}"
        f" {'vol sw/' + unit:>11} {'invol/' + unit:>10} {'faults/' + unit:>11}"
    )
    if chunks:
        header += f" {'vol sw/chunk':>12}"
    print(header)

    def row(rank: int, name: str, n: str, counts: list[float]) -> str:
        cpu, vol, invol, faults = (c / per for c in counts)
        return (
            f"  {rank:>4}  {name:<18} {n:>2} {cpu * 1e3:>11.2f}"
            f" {vol:>11.1f} {invol:>10.1f} {faults:>11.0f}"
        )

    for r in sorted(ranks, key=lambda r: r["rank"]):
        busy = sorted(r["threads"].items(), key=lambda kv: -kv[1][0])
        for name, (cpu, vol, invol, faults, n) in busy:
            if cpu == 0 and vol == 0 and invol == 0 and faults == 0:
                continue
            line = row(r["rank"], name, str(int(n)), [cpu, vol, invol, faults])
            if chunks:
                line += f" {vol / per / chunks:>12.2f}"
            print(line)
        # The process's minor faults, which include threads that have ended.
        totals = [sum(v[i] for v in r["threads"].values()) for i in range(3)]
        print(row(r["rank"], "(all threads)", "", [*totals, r["faults"]]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="grpc,gloo")
    parser.add_argument("--op", default="allreduce", choices=["allreduce", "broadcast"])
    parser.add_argument("--size", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="sleep S seconds after the warm-up instead of timing calls; report per second",
    )
    args = parser.parse_args(argv)
    args.chunk_bytes = int(os.environ.get("TORCH_GRPC_PG_CHUNK_BYTES", 2 << 20))
    machine = machine_info()
    print(f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['platform']}")
    print(
        f"torch {machine['torch']}, threads per rank: torch's default ({torch.get_num_threads()})"
    )
    failed = False
    for backend in args.backends.split(","):
        ranks: list[dict[str, Any]] = []
        payload = {
            "backend": backend,
            "op": args.op,
            "bytes": args.size,
            "calls": args.calls,
            "idle_s": args.idle,
        }
        try:
            run_world(
                profile_rank,
                args.world,
                payload,
                lambda kind, data, into=ranks: (
                    into.append(data) if kind == "rank" else None
                ),
                threads=0,
                default_backend=backend,
            )
        except WorldFailed as exc:
            failed = True
            print(f"error: {backend}: {exc}", file=sys.stderr)
            continue
        report(backend, args, ranks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
