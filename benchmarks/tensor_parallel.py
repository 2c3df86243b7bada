"""Tensor-parallel inference on one host: tokens per second over grpc, gloo and DeepSpeed.

    .venv-anchors/bin/python benchmarks/tensor_parallel.py [--quick]
    .venv/bin/python benchmarks/tensor_parallel.py --backends grpc,gloo --world-sizes 2

A small transformer's forward pass (_tp_model.py: hidden 1024, 16 heads, 2 layers, MLP
4x; attention and MLP split column- then row-parallel as Megatron does, one allreduce
after each row-parallel layer) on W ranks, one intra-op thread each. The allreduces are
explicit calls, not torch's DTensor / torch.distributed.tensor.parallel: the DeepSpeed
variant must swap the one call for its own, and explicit calls keep the three variants
the same code but for it. grpc and gloo: `dist.all_reduce` on the backend as the
default group; deepspeed: `deepspeed.comm.inference_all_reduce` on its shared-memory
path (what DeepSpeed's own tensor-parallel layers call; _anchor_deepspeed.py), over a
gloo default group.

Two cases: decode-like, a few sequences of one token each (allreduces of a few tens of
KiB), and prefill-like, one sequence of many tokens (allreduces of a MiB or more).
Every run first checks that each rank's output matches the whole model run in that
process alone (max abs error within --tolerance), then times forward passes back to back
(_call_timing.py). Rounds of fresh processes, the backends' order reversed every other
round; the table gives tokens per second (median over rounds, min, max) and grpc's
forward time over each backend's (below 1.00x grpc is faster).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import _anchor_deepspeed
import torch
import torch.distributed as dist
from _anchor_env import describe, header_lines
from _args import parse_ints, parse_list
from _backends import unavailable_reason
from _call_timing import CallBudget, time_calls
from _report import (
    Column,
    OtherLoad,
    fmt_bytes,
    fmt_num,
    fmt_ratio,
    format_table,
    other_load_note,
    write_outputs,
)
from _spawn import RankContext, WorldFailed, run_world
from _tp_model import Shape, forward, full_layers, shard_layers

CANDIDATE = "grpc"
SEED = 1234


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    """`decode:8x1,prefill:1x256`: name:sequences x tokens each."""
    cases = []
    for item in parse_list(text):
        name, _, dims = item.partition(":")
        batch, _, tokens = dims.partition("x")
        if not (name and batch.isdigit() and tokens.isdigit()):
            raise argparse.ArgumentTypeError(f"{item!r}: write name:BATCHxTOKENS")
        cases.append((name, int(batch), int(tokens)))
    return cases


def tp_rank(ctx: RankContext) -> None:
    p = ctx.payload
    shape = Shape(**p["shape"])
    budget = CallBudget(**p["budget"])
    if p["backend"] == "deepspeed":
        allreduce = _anchor_deepspeed.shm_allreduce(ctx, p["tag"])
    else:
        allreduce = dist.all_reduce
    full = full_layers(shape, SEED)
    mine = shard_layers(full, shape, ctx.rank, ctx.world)
    with torch.no_grad():
        for name, batch, tokens in p["cases"]:
            gen = torch.Generator().manual_seed(SEED + tokens)
            x = torch.randn(batch, tokens, shape.hidden, generator=gen)
            sharded = forward(mine, x, shape, allreduce)
            error = (sharded - forward(full, x, shape, None)).abs().max().item()
            if not ctx.agree(error <= p["tolerance"]):
                raise RuntimeError(
                    f"{p['backend']} {name}: output differs from the one-process model "
                    f"(rank {ctx.rank}: max abs error {error:.3g})"
                )
            timing = time_calls(
                lambda x=x: forward(mine, x, shape, allreduce),
                ctx.barrier,
                lambda v: ctx.max_across([v])[0],
                budget,
            )
            error = ctx.max_across([error])[0]
            if ctx.rank == 0:
                ctx.emit(
                    "row",
                    {
                        "case": name,
                        "batch": batch,
                        "tokens": tokens,
                        "max_abs_error": error,
                        **timing,
                    },
                )


def run_backend(
    backend: str, world: int, args: argparse.Namespace, tag: str
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    payload = {
        "backend": backend,
        "shape": vars(args.shape),
        "cases": args.cases,
        "budget": vars(args.budget),
        "tolerance": args.tolerance,
        "tag": tag,
    }
    try:
        run_world(
            tp_rank,
            world,
            payload,
            lambda kind, data: rows.append(data) if kind == "row" else None,
            threads=1,
            timeout_s=args.timeout,
            default_backend="gloo" if backend == "deepspeed" else backend,
        )
    finally:
        if backend == "deepspeed":
            _anchor_deepspeed.remove_segments(tag)
    return rows


def summarize(
    rows: list[dict[str, Any]], backends: list[str], shape: Shape
) -> list[dict[str, Any]]:
    keyed: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        keyed.setdefault((row["world"], row["case"], row["backend"]), []).append(row)
    order = {b: i for i, b in enumerate(backends)}
    summary = []
    for (world, case, backend), runs in sorted(
        keyed.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])
    ):
        tokens = runs[0]["batch"] * runs[0]["tokens"]
        rates = [tokens / r["seconds"] for r in runs]
        median = statistics.median(r["seconds"] for r in runs)
        grpc = [r["seconds"] for r in keyed.get((world, case, CANDIDATE), [])]
        other = backend != CANDIDATE and grpc
        summary.append(
            {
                "world": world,
                "case": case,
                "tokens": tokens,
                "allreduce_bytes": tokens * shape.hidden * 4,
                "allreduces": 2 * shape.layers,
                "backend": backend,
                "rounds": len(runs),
                "forward_ms": median * 1e3,
                "tokens_per_s": statistics.median(rates),
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "max_abs_error": max(r["max_abs_error"] for r in runs),
                # grpc's forward time over this backend's: below 1, grpc is faster.
                "grpc_over": statistics.median(grpc) / median if other else None,
            }
        )
    return summary


TABLE = [
    Column("case", "case"),
    Column("tokens", "tokens"),
    Column("allreduce", "allreduce_bytes", fmt_bytes),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("rounds", "rounds"),
    Column("forward ms", "forward_ms", fmt_num(2)),
    Column("tokens/s", "tokens_per_s", fmt_num(0)),
    Column("min", "tokens_per_s_min", fmt_num(0)),
    Column("max", "tokens_per_s_max", fmt_num(0)),
    Column("max abs err", "max_abs_error", lambda v: f"{v:.1e}"),
    Column("grpc / it", "grpc_over", fmt_ratio),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", type=parse_list, default=parse_list("grpc,gloo,deepspeed")
    )
    parser.add_argument("--world-sizes", type=parse_ints, default=[2, 4])
    parser.add_argument(
        "--cases",
        type=parse_cases,
        default=None,
        help="default decode:8x1,prefill:1x256",
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="timed forward passes per case (1 s)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="max abs error against one process",
    )
    parser.add_argument(
        "--quick", action="store_true", help="prefill of 128 tokens, 0.3 s a case"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    args.cases = args.cases or parse_cases(
        "decode:8x1,prefill:1x128" if args.quick else "decode:8x1,prefill:1x256"
    )
    args.shape = Shape(hidden=args.hidden, heads=args.heads, layers=args.layers)
    for world in args.world_sizes:
        if args.hidden % args.heads or args.heads % world:
            parser.error(
                f"--heads must divide --hidden, and world {world} must divide --heads"
            )
    args.budget = CallBudget(
        seconds=args.seconds or (0.3 if args.quick else 1.0),
        min_calls=5,
        max_calls=1000,
        warmup=3,
    )
    return args


def usable_backends(requested: list[str]) -> tuple[list[str], list[str]]:
    usable, notes = [], []
    for name in requested:
        reason = (
            _anchor_deepspeed.unavailable_reason()
            if name == "deepspeed"
            else unavailable_reason(name, "cpu")
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
    shape = args.shape
    print(
        f"model: hidden {shape.hidden}, {shape.heads} heads, {shape.layers} layers, MLP {shape.ffn}; "
        "explicit all_reduce after each row-parallel linear; one thread per rank"
    )
    backends, notes = usable_backends(args.backends)
    for note in notes:
        print(note)
    if not backends:
        return 1
    other_load = OtherLoad()
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    tags = (f"{os.getpid()}{i:04d}" for i in itertools.count())
    for world, round_ in itertools.product(args.world_sizes, range(args.rounds)):
        for backend in backends if round_ % 2 == 0 else backends[::-1]:
            print(f"world {world}, round {round_ + 1}: {backend}", flush=True)
            try:
                for row in run_backend(backend, world, args, next(tags)):
                    rows.append(
                        {**row, "world": world, "backend": backend, "round": round_}
                    )
            except WorldFailed as exc:
                errors.append(f"{backend}, world {world}, round {round_ + 1}: {exc}")
                print(f"error: {errors[-1]}", file=sys.stderr)
    load = other_load.finish()
    summary = summarize(rows, backends, shape)
    print()
    print(format_table(summary, TABLE))
    print(
        f"\n{CANDIDATE} / it: grpc's forward time over that backend's; below 1.00x grpc is faster"
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
        "shape": vars(shape),
        "budget": vars(args.budget),
        "tolerance": args.tolerance,
        "allreduce": "explicit dist.all_reduce / deepspeed.comm.inference_all_reduce",
        "skipped": notes,
        "errors": errors,
    }
    paths = write_outputs(
        args.out, "tensor_parallel", meta, {"rows": summary, "runs": rows}
    )
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
