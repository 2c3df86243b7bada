"""DDP training-step time of "grpc" against gloo (nccl on cuda), in the same run.

    .venv/bin/python benchmarks/ddp_step.py --quick
    .venv/bin/python benchmarks/ddp_step.py --world-sizes 2,4

One set of W spawned ranks per world size builds one DDP replica of each model per
backend and alternates between the backends step by step, so that drift of the machine
hits them alike. A step is zero_grad + forward + backward (gradient allreduce inside) +
optimizer step; its time is the slowest rank's, and the reported step time is the median
over all timed steps.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from _args import (
    add_common_args,
    candidate_backend,
)
from _backends import backends_for_world
from _measure import device_sync, p90
from _report import (
    TARGET_TABLE,
    Column,
    Progress,
    Row,
    fmt_num,
    fmt_ratio,
    format_table,
    other_load_note,
    write_outputs,
)
from _run_start import start_run
from _spawn import RankContext, WorldFailed, default_threads, run_world
from _targets import ddp_targets
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class ModelSpec:
    name: str
    width: int
    depth: int

    def build(self) -> nn.Module:
        layers: list[nn.Module] = []
        for i in range(self.depth):
            layers.append(nn.Linear(self.width, self.width))
            if i < self.depth - 1:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    @property
    def params(self) -> int:
        return self.depth * (self.width * self.width + self.width)


MODELS = [ModelSpec("mlp-5M", 1024, 5), ModelSpec("mlp-50M", 2048, 12)]


@dataclass
class _Replica:
    model: nn.Module
    optimizer: torch.optim.Optimizer


def _step(replica: _Replica, x: torch.Tensor, y: torch.Tensor) -> None:
    replica.optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(replica.model(x), y)
    loss.backward()
    replica.optimizer.step()


def _attempt(ctx: RankContext, fn: Callable[[], None]) -> str:
    """Run fn on every rank; '' if it worked everywhere, else why (the same on all)."""
    error = ""
    try:
        fn()
    except Exception as exc:  # any failure becomes the row's status, on every rank
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if ctx.agree(not error):
        return ""
    return error or "failed on another rank"


def _bench_model(
    ctx: RankContext, spec: ModelSpec, groups: dict[str, dist.ProcessGroup]
) -> list[Row]:
    p = ctx.payload
    device = ctx.device
    sync = device_sync(device)
    gen = torch.Generator().manual_seed(1234 + ctx.rank)
    x = torch.randn(p["batch"], spec.width, generator=gen).to(device)
    y = torch.randn(p["batch"], spec.width, generator=gen).to(device)
    replicas: dict[str, _Replica] = {}
    status: dict[str, str] = {}

    for backend, group in groups.items():

        def build(backend: str = backend, group: dist.ProcessGroup = group) -> None:
            torch.manual_seed(0)
            model = spec.build().to(device)
            ids = [device.index] if device.type == "cuda" else None
            ddp = DDP(model, process_group=group, device_ids=ids)
            replicas[backend] = _Replica(
                ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4)
            )
            for _ in range(p["warmup"]):
                _step(replicas[backend], x, y)
            sync()

        status[backend] = _attempt(ctx, build)

    # The backends take turns step by step, in alternating order, so that a burst of
    # other work on the machine lands on all of them alike.
    times: dict[str, list[float]] = {b: [] for b in groups}
    for i in range(p["steps"]):
        order = list(groups) if i % 2 == 0 else list(reversed(groups))
        for backend in order:
            if status[backend]:
                continue

            def timed_step(backend: str = backend) -> None:
                ctx.barrier()
                start = time.perf_counter()
                _step(replicas[backend], x, y)
                sync()
                times[backend].append(time.perf_counter() - start)

            status[backend] = _attempt(ctx, timed_step)

    rows: list[Row] = []
    for backend in groups:
        row: Row = {"model": spec.name, "params": spec.params, "world": ctx.world}
        row.update(backend=backend, batch_per_rank=p["batch"])
        if status[backend]:
            rows.append({**row, "status": f"skipped: {status[backend]}"})
            continue
        steps = ctx.max_across(times[backend])
        median = statistics.median(steps)
        row.update(status="ok", step_ms=median * 1e3, steps=len(steps))
        row.update(step_p90_ms=p90(steps) * 1e3)
        row.update(samples_per_s=p["batch"] * ctx.world / median)
        rows.append(row)
    return rows


def ddp_rank(ctx: RankContext) -> None:
    groups = {b: ctx.new_group(b) for b in ctx.payload["backends"]}
    for spec in ctx.payload["models"]:
        rows = _bench_model(ctx, spec, groups)
        gc.collect()
        if ctx.rank == 0:
            for row in rows:
                ctx.emit("row", row)


def add_ratios(rows: list[Row], ref: str) -> None:
    refs = {
        (r["model"], r["world"]): r
        for r in rows
        if r["backend"] == ref and r["status"] == "ok"
    }
    for row in rows:
        base = refs.get((row["model"], row["world"]))
        if row["status"] == "ok" and base is not None and row["backend"] != ref:
            row["ratio_step"] = row["step_ms"] / base["step_ms"]


TABLE = [
    Column("model", "model"),
    Column("params", "params", lambda n: f"{n / 1e6:.1f}M"),
    Column("world", "world"),
    Column("backend", "backend"),
    Column("batch/rank", "batch_per_rank"),
    Column("step ms", "step_ms", fmt_num(1)),
    Column("p90 ms", "step_p90_ms", fmt_num(1)),
    Column("samples/s", "samples_per_s", fmt_num(1)),
    Column("step vs ref", "ratio_step", fmt_ratio),
    Column("steps", "steps"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument(
        "--batch", type=int, default=32, help="samples per rank per step"
    )
    parser.add_argument("--warmup", type=int, default=None, help="default 5, quick 2")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps per backend (default 30, quick 16)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.warmup = args.warmup if args.warmup is not None else (2 if quick else 5)
    args.steps = args.steps if args.steps is not None else (16 if quick else 30)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    start = start_run(args)
    if start is None:
        return 1
    machine, other_load, ref = start.machine, start.other_load, start.reference
    backends, notes = start.backends, start.notes
    worlds = args.world_sizes or [2]
    for note in notes:
        print(f"note: {note}", file=sys.stderr)

    rows: list[Row] = []
    failed = False
    progress = Progress(len(worlds) * len(MODELS) * len(backends), "ddp")

    def on_message(kind: str, data: Any) -> None:
        if kind == "row":
            rows.append(data)
            progress.step(f"{data['model']} w{data['world']} {data['backend']}")

    for world in worlds:
        world_backends, world_notes = backends_for_world(backends, world, args.device)
        notes += world_notes
        payload = {
            "backends": world_backends,
            "models": MODELS,
            "batch": args.batch,
            "warmup": args.warmup,
            "steps": args.steps,
        }
        threads = args.threads_per_rank or default_threads(world)
        try:
            run_world(
                ddp_rank, world, payload, on_message, args.device, threads, args.timeout
            )
        except WorldFailed as exc:
            failed = True
            progress.write(f"error: {exc}")
            notes.append(str(exc).splitlines()[0])
    progress.close()

    add_ratios(rows, ref)
    targets = ddp_targets(rows, candidate_backend(args.backends, args.device), ref)
    notes += [
        f"{r['backend']} {r['model']} w{r['world']}: {r['status']}"
        for r in rows
        if r["status"] != "ok"
    ]
    elapsed = time.monotonic() - started
    machine["during_run"] = other_load.finish()
    if note := other_load_note(machine["during_run"]):
        notes.append(note)
    meta = {
        "machine": machine,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "reference_backend": ref,
        "models": [{**asdict(m), "params": m.params} for m in MODELS],
        "threads_per_rank_by_world": {
            w: args.threads_per_rank or default_threads(w) for w in worlds
        },
        "notes": notes,
        "elapsed_s": elapsed,
    }
    print(format_table([r for r in rows if r["status"] == "ok"], TABLE))
    print("\nTargets:")
    print(format_table(targets, TARGET_TABLE))
    for note in notes:
        print(f"note: {note}")
    tables = {"rows": rows, "targets": targets}
    paths = write_outputs(args.out, f"ddp_step_{args.device}", meta, tables)
    print(f"\nwrote {', '.join(str(p) for p in paths)} in {elapsed:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
