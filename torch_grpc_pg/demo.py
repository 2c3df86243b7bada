"""Train a small model with DDP on 2 local ranks over "grpc", then "gloo"; compare.

    python -m torch_grpc_pg.demo [--backends grpc,gloo] [--steps 200]
    python -m torch_grpc_pg.demo --fault-tolerant    # torchft: a replica dies and heals (demo_ft.py)

For each backend this launches torchrun on this file in worker mode; rank 0 prints the
loss and the time per step as training goes, and a final summary compares the backends.
Both runs use the same seeds, so the two loss curves agree up to reduction order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torch_grpc_pg._ports import free_port

RESULT_TAG = "DEMO_RESULT "
UNAVAILABLE_TAG = "DEMO_UNAVAILABLE "
# Left out of the mean step time: the first steps pay for connection set-up.
WARMUP_STEPS = 3


# ---------------------------------------------------------------- worker (one per rank)


def _unavailable(reason: str) -> int:
    # Exit 0 so torchrun does not bury the reason under its failure report; the launcher
    # fails instead.
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(UNAVAILABLE_TAG + reason, flush=True)
    return 0


def worker(backend: str, steps: int, log_every: int) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "grpc":
        try:
            import torch_grpc_pg  # noqa: F401 - importing registers the "grpc" backend
        except ImportError as exc:
            return _unavailable(f"import torch_grpc_pg failed: {exc}")
    if backend not in dist.Backend.backend_list:
        return _unavailable(
            f"backend {backend!r} is not registered (is the extension built?)"
        )

    torch.set_num_threads(1)
    dist.init_process_group(backend)  # env:// rendezvous set up by torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    teacher = nn.Linear(32, 1)
    model = nn.Sequential(
        nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1)
    )
    ddp = DDP(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(100 + rank)  # each rank sees different samples

    step_times: list[float] = []
    window: list[float] = []
    loss = torch.zeros(())
    for step in range(1, steps + 1):
        x = torch.randn(128, 32, generator=data)
        with torch.no_grad():
            y = torch.sin(3 * teacher(x))
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP allreduces the gradients over `backend` here
        optimizer.step()
        step_times.append(time.perf_counter() - start)
        window.append(step_times[-1])
        if step == 1 or step % log_every == 0 or step == steps:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            mean_loss /= world
            if rank == 0:
                ms = sum(window) / len(window) * 1e3
                print(
                    f"[{backend}] step {step:5d}  loss {mean_loss.item():.5f}  "
                    f"{ms:7.2f} ms/step",
                    flush=True,
                )
            window.clear()

    final = loss.detach().clone()
    dist.all_reduce(final)
    timed = step_times[WARMUP_STEPS:] or step_times
    if rank == 0:
        result = {
            "backend": backend,
            "final_loss": final.item() / world,
            "mean_step_ms": sum(timed) / len(timed) * 1e3,
        }
        print(RESULT_TAG + json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- launcher


def launch(
    backend: str, nproc: int, steps: int, log_every: int
) -> dict[str, float] | None:
    """Run the worker under torchrun; stream its output; return rank 0's result line."""
    here = Path(__file__).resolve()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(here),
        "--worker",
        "--backend",
        backend,
        "--steps",
        str(steps),
        "--log-every",
        str(log_every),
    ]
    env = dict(os.environ)
    # Running a file puts its directory first on sys.path, where modules of this package
    # could shadow top-level ones; safe-path mode stops that, and PYTHONPATH still finds
    # an uninstalled checkout.
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(here.parent.parent), env.get("PYTHONPATH")])
    )
    env.setdefault(
        "OMP_NUM_THREADS", "1"
    )  # torchrun would set it anyway, with a warning
    result: dict[str, float] | None = None
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG) :])
            elif line.startswith(UNAVAILABLE_TAG):
                print(
                    f"  {backend} is unavailable: {line[len(UNAVAILABLE_TAG) :]}",
                    end="",
                )
            else:
                print(f"  {line}", end="", flush=True)
    if proc.returncode != 0:
        print(f"  torchrun for {backend} exited with code {proc.returncode}")
        return None
    return result


def compare(results: dict[str, dict[str, float] | None]) -> None:
    print("\nbackend   final loss   mean step ms")
    for backend, r in results.items():
        if r is None:
            print(f"{backend:<8}  failed")
        else:
            print(f"{backend:<8}  {r['final_loss']:10.5f}   {r['mean_step_ms']:12.2f}")
    done = {b: r for b, r in results.items() if r is not None}
    if "grpc" in done and "gloo" in done:
        grpc, gloo = done["grpc"], done["gloo"]
        print(
            f"grpc/gloo mean step time: "
            f"{grpc['mean_step_ms'] / gloo['mean_step_ms']:.2f}x"
        )
        gap = abs(grpc["final_loss"] - gloo["final_loss"])
        print(
            f"final loss difference: {gap:.2e} "
            "(same seeds: only the reduction order may differ)"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--fault-tolerant" in argv:
        from torch_grpc_pg import demo_ft

        return demo_ft.main([a for a in argv if a != "--fault-tolerant"])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", default="grpc,gloo", help="comma list, run in this order"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--nproc", type=int, default=2, help="local ranks")
    parser.add_argument(
        "--log-every", type=int, default=None, help="default: steps // 10"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    log_every = args.log_every or max(1, args.steps // 10)
    if args.worker:
        return worker(args.backend, args.steps, log_every)

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results: dict[str, dict[str, float] | None] = {}
    for backend in backends:
        print(
            f"== {backend}: DDP on {args.nproc} local ranks, {args.steps} steps",
            flush=True,
        )
        results[backend] = launch(backend, args.nproc, args.steps, log_every)
    compare(results)
    return 0 if all(r is not None for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
