"""One host: grpc against gloo, Open MPI and DeepSpeed's shared-memory allreduce.

    make bench-anchors                       # the venv with the anchors, then this
    .venv-anchors/bin/python benchmarks/one_host.py [--quick]
    .venv-anchors/bin/python benchmarks/one_host.py --sizes 4K,1M --world-sizes 2 --rounds 5

float32 allreduce (sum) at each size and world size, one thread per rank. Each backend
runs in processes of its own, as a user's job would:
- grpc and gloo: spawned ranks with the backend as the default group, timing
  `dist.all_reduce(t)` (as user_mode.py does);
- openmpi: `mpirun -n W` of _mpi_allreduce_rank.py, timing mpi4py's
  `comm.Allreduce` on numpy buffers (MPI_IN_PLACE, its faster form here; see
  _anchor_mpi.py for the mpirun options and why);
- deepspeed: spawned ranks with a gloo default group, timing
  `deepspeed.comm.inference_all_reduce(t)` on its shared-memory path (_anchor_deepspeed.py
  checks that it is that path);
- fake (at world 1 only; `--world-sizes 1,2`): torch's fake backend, a C++ backend whose
  every call returns a finished Work at once. Its time is what `dist.all_reduce` costs in
  torch before any backend does anything: the floor under grpc's and gloo's times, which
  DeepSpeed's and Open MPI's calls do not pay (they bypass torch.distributed).
An anchor that is not installed is skipped with a note, so this also runs in the main
.venv with grpc and gloo alone.

Every (world, backend) run checks one result per size (each rank sends rank + 1), warms
up, then times back-to-back calls one by one, as many as fill --seconds within
--min-calls..--max-calls (_call_timing.py); a run's number is the slowest rank's median.
Rounds repeat this with fresh processes, the backends' order reversed every other round
so that drift of the machine touches all alike. The table gives the median over rounds,
their min and max, and grpc's time over each backend's: below 1.00x grpc is faster.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _anchor_deepspeed
import _anchor_mpi
import torch
from _anchor_env import describe, header_lines
from _args import parse_ints, parse_list, parse_sizes
from _backends import unavailable_reason
from _call_timing import CallBudget, time_calls
from _collective_ops import Case, CollectiveOp, _all_equal, ready_on_default_group
from _report import (
    Column,
    OtherLoad,
    fmt_bytes,
    fmt_ratio,
    format_table,
    other_load_note,
    write_outputs,
)
from _spawn import RankContext, WorldFailed, run_world

CANDIDATE = "grpc"
FLOOR = "fake"
BACKENDS = "grpc,gloo,openmpi,deepspeed,fake"
SIZES = "4K,64K,1M,16M,64M"
QUICK_SIZES = "4K,1M,64M"
ANCHORS = {"openmpi": _anchor_mpi, "deepspeed": _anchor_deepspeed}


def deepspeed_op(
    ctx: RankContext, allreduce: Callable[[torch.Tensor], object], nbytes: int
) -> CollectiveOp:
    """DeepSpeed's shm allreduce as a CollectiveOp, checked as ready_on_default_group does."""
    t = torch.empty(nbytes // 4, dtype=torch.float32)
    op = CollectiveOp(
        lambda: allreduce(t),
        lambda: t.fill_(ctx.rank + 1),
        lambda: _all_equal(t, ctx.world * (ctx.world + 1) // 2),
        t.zero_,
    )
    op.fill()
    op.run()
    if not ctx.agree(op.check()):
        raise RuntimeError(f"deepspeed allreduce {nbytes} B: wrong result")
    op.reset()
    return op


def torch_rank(ctx: RankContext) -> None:
    """grpc, gloo (the default group) or DeepSpeed: every size, checked, then timed."""
    p = ctx.payload
    budget = CallBudget(**p["budget"])
    if p["backend"] == "deepspeed":
        ds_allreduce = _anchor_deepspeed.shm_allreduce(ctx, p["tag"])
    for nbytes in p["sizes"]:
        if p["backend"] == "deepspeed":
            op = deepspeed_op(ctx, ds_allreduce, nbytes)
        else:
            case = Case("allreduce", "float32", nbytes, ctx.world, p["backend"])
            op = ready_on_default_group(ctx, case, warmup=0)
        timing = time_calls(
            op.run, ctx.barrier, lambda v: ctx.max_across([v])[0], budget
        )
        if ctx.rank == 0:
            ctx.emit("row", {"bytes": nbytes, "checked": True, **timing})


def run_backend(
    backend: str, world: int, args: argparse.Namespace, tag: str
) -> list[dict[str, Any]]:
    """One fresh set of ranks of `backend`: a row per size."""
    if backend == "openmpi":
        library, rows = _anchor_mpi.run_mpi_world(
            world, args.sizes, args.budget, in_place=True, timeout_s=args.timeout * 4
        )
        # The library mpi4py really runs on, as MPI_Get_library_version reports it.
        return [{**row, "library": library} for row in rows]
    rows: list[dict[str, Any]] = []
    payload = {
        "backend": backend,
        "sizes": args.sizes,
        "budget": vars(args.budget),
        "tag": tag,
    }
    try:
        run_world(
            torch_rank,
            world,
            payload,
            lambda kind, data: rows.append(data) if kind == "row" else None,
            threads=1,
            timeout_s=args.timeout,
            # DeepSpeed's fallback and its barriers go through the default group.
            default_backend="gloo" if backend == "deepspeed" else backend,
        )
    finally:
        if backend == "deepspeed":
            _anchor_deepspeed.remove_segments(tag)
    return rows


def summarize(rows: list[dict[str, Any]], backends: list[str]) -> list[dict[str, Any]]:
    """Per (world, size, backend): median, min and max over rounds; grpc's time over it."""
    keyed: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        keyed.setdefault((row["world"], row["bytes"], row["backend"]), []).append(row)
    order = {b: i for i, b in enumerate(backends)}
    summary = []
    for (world, nbytes, backend), runs in sorted(
        keyed.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])
    ):
        times = [r["seconds"] for r in runs]
        grpc_by_round = {
            r["round"]: r["seconds"] for r in keyed.get((world, nbytes, CANDIDATE), [])
        }
        ratios = [
            grpc_by_round[r["round"]] / r["seconds"]
            for r in runs
            if r["round"] in grpc_by_round
        ]
        other = backend != CANDIDATE and ratios
        median = statistics.median(times)
        grpc_median = (
            statistics.median(grpc_by_round.values()) if grpc_by_round else None
        )
        summary.append(
            {
                "world": world,
                "bytes": nbytes,
                "backend": backend,
                "rounds": len(runs),
                "median_us": median * 1e6,
                "min_us": min(times) * 1e6,
                "max_us": max(times) * 1e6,
                "calls": int(statistics.median(r["calls"] for r in runs)),
                "checked": all(r["checked"] for r in runs),
                # grpc time / this backend's time: below 1, grpc is faster.
                "grpc_over": grpc_median / median if other and grpc_median else None,
                "grpc_over_min": min(ratios) if other else None,
                "grpc_over_max": max(ratios) if other else None,
            }
        )
    return summary


def ratio_table(
    summary: list[dict[str, Any]], backends: list[str]
) -> tuple[list[dict[str, Any]], list[Column]]:
    """One line per (world, size): grpc's median time and its ratio to each other backend."""
    lines: dict[tuple[int, int], dict[str, Any]] = {}
    for row in summary:
        line = lines.setdefault(
            (row["world"], row["bytes"]), {"world": row["world"], "bytes": row["bytes"]}
        )
        if row["backend"] == CANDIDATE:
            line["grpc_us"] = row["median_us"]
        else:
            line[f"grpc/{row['backend']}"] = row["grpc_over"]
    others = [b for b in backends if b != CANDIDATE]
    columns = [
        Column("size", "bytes", fmt_bytes),
        Column("world", "world"),
        Column("grpc median", "grpc_us", fmt_us),
        *(Column(f"grpc/{b}", f"grpc/{b}", fmt_ratio) for b in others),
    ]
    return list(lines.values()), columns


def fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} µs"


TABLE = [
    Column("size", "bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("rounds", "rounds"),
    Column("calls", "calls"),
    Column("median", "median_us", fmt_us),
    Column("min", "min_us", fmt_us),
    Column("max", "max_us", fmt_us),
    Column("checked", "checked", lambda v: "yes" if v else "NO"),
    Column("grpc / it", "grpc_over", fmt_ratio),
    Column("per round min", "grpc_over_min", fmt_ratio),
    Column("max", "grpc_over_max", fmt_ratio),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", type=parse_list, default=parse_list(BACKENDS))
    parser.add_argument("--sizes", type=parse_sizes, default=None)
    parser.add_argument("--world-sizes", type=parse_ints, default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds", type=float, default=None, help="timed calls per case (0.5 s)"
    )
    parser.add_argument("--min-calls", type=int, default=5)
    parser.add_argument("--max-calls", type=int, default=None, help="(2000)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"sizes {QUICK_SIZES}, 0.15 s and at most 500 calls a case",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds: at least 3, so that a round's hiccup cannot decide")
    args.sizes = args.sizes or parse_sizes(QUICK_SIZES if args.quick else SIZES)
    args.budget = CallBudget(
        seconds=args.seconds or (0.15 if args.quick else 0.5),
        min_calls=args.min_calls,
        max_calls=args.max_calls or (500 if args.quick else 2000),
        warmup=args.warmup,
    )
    return args


def usable_backends(requested: list[str]) -> tuple[list[str], list[str]]:
    usable, notes = [], []
    for name in requested:
        anchor = ANCHORS.get(name)
        reason = (
            anchor.unavailable_reason() if anchor else unavailable_reason(name, "cpu")
        )
        if reason is None:
            usable.append(name)
        else:
            notes.append(f"skipping {name}: {reason}")
    return usable, notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = describe()
    print("\n".join(header_lines(info)))
    backends, notes = usable_backends(args.backends)
    for note in notes:
        print(note)
    if not backends:
        print("no backend left to run", file=sys.stderr)
        return 1
    other_load = OtherLoad()
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    tags = (f"{os.getpid()}{i:04d}" for i in itertools.count())
    for world, round_ in itertools.product(args.world_sizes, range(args.rounds)):
        for backend in backends if round_ % 2 == 0 else backends[::-1]:
            if backend == FLOOR and world != 1:
                continue  # it moves no data, so its result is right only alone
            print(f"world {world}, round {round_ + 1}: {backend}", flush=True)
            try:
                for row in run_backend(backend, world, args, next(tags)):
                    rows.append(
                        {**row, "world": world, "backend": backend, "round": round_}
                    )
            except (WorldFailed, _anchor_mpi.MpiFailed) as exc:
                errors.append(f"{backend}, world {world}, round {round_ + 1}: {exc}")
                print(f"error: {errors[-1]}", file=sys.stderr)
    load = other_load.finish()
    summary = summarize(rows, backends)
    print()
    print(format_table(summary, TABLE))
    ratios, ratio_columns = ratio_table(summary, backends)
    print()
    print(format_table(ratios, ratio_columns))
    print(
        f"\n{CANDIDATE} / it: grpc's median time over that backend's; below 1.00x grpc is faster"
    )
    if "deepspeed" in backends and max(args.world_sizes) > (os.cpu_count() or 1):
        print(
            f"note: more ranks than the {os.cpu_count()} CPUs: DeepSpeed's ranks wait "
            "for each other by spinning on flags in shared memory (shm.cpp), so a "
            "rank that waits holds a CPU that the rank it waits for may need"
        )
    if note := other_load_note(load):
        print(f"note: {note}")
    meta = {
        **info,
        **load,
        "command": " ".join(sys.argv),
        "budget": vars(args.budget),
        "skipped": notes,
        "errors": errors,
        "threads_per_rank": 1,
    }
    paths = write_outputs(
        args.out, "one_host", meta, {"rows": summary, "ratios": ratios, "runs": rows}
    )
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
