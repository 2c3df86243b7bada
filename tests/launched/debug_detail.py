"""Collectives and DDP under TORCH_DISTRIBUTED_DEBUG=DETAIL, then ranks that disagree.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node 2 debug_detail.py

``BACKEND`` is the backend string (``grpc`` unless set; ``cpu:grpc,cuda:gloo`` mixes).

Each rank writes ``$OUTCOME_DIR/rank<R>.json``: its allreduce and allgather results,
DDP's gradient next to the same gradient computed on the whole batch in float64 in this
process, and the error of a collective whose size differs between the ranks. Run by
tests/test_torchrun.py, which compares them with exact values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_grpc_pg  # noqa: F401  (registers "grpc")


def batch(rank: int) -> torch.Tensor:
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))


def main() -> None:
    dist.init_process_group(os.environ.get("BACKEND", "grpc"))
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, object] = {
        "debug_level": str(dist.get_debug_level()),
        "cpu_backend": type(
            dist.group.WORLD._get_backend(torch.device("cpu"))
        ).__name__,
    }

    x = torch.arange(4.0) + rank
    dist.all_reduce(x)
    out["all_reduce"] = x.tolist()
    gathered = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = [t.tolist() for t in gathered]

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    model(batch(rank)).square().mean().backward()
    reference = torch.nn.Linear(3, 1).double()
    reference.load_state_dict(model.module.state_dict())
    whole = torch.cat([batch(r) for r in range(world)]).double()
    reference(whole).square().mean().backward()
    out["ddp_grad"] = model.module.weight.grad.flatten().tolist()
    out["reference_grad"] = reference.weight.grad.flatten().tolist()

    try:
        dist.all_reduce(torch.zeros(3 + rank))
        out["mismatch"] = None
    except Exception as exc:
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    Path(os.environ["OUTCOME_DIR"], f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
