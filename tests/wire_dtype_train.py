"""One rank of the training check in tests/test_wire_dtype.py: DDP, then FSDP2, in float32.

    RANK=r WORLD_SIZE=w MASTER_ADDR=... MASTER_PORT=... python tests/wire_dtype_train.py OUT

Each trains the same model from the same start on this rank's batches and records the loss
of every step; the backend's wire_dtype comes from TORCH_GRPC_PG_WIRE_DTYPE. Saves
OUT/rank{r}.pt with both loss curves and the trained parameters.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 40
LR = 0.05
BATCH = 16
# 80k parameters: several DDP buckets' worth of chunks, and shards that cross hosts.
FEATURES, HIDDEN, OUTPUTS = 32, 256, 8


def initial_model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, OUTPUTS),
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression target the model can learn: a fixed random map of the inputs."""
    gen = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    teacher = torch.Generator().manual_seed(99)
    w = torch.randn(FEATURES, OUTPUTS, generator=teacher) / FEATURES**0.5
    return x, torch.tanh(x @ w)


def train(model: nn.Module, rank: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    import torch_grpc_pg  # noqa: F401  (registers the backend)

    dist.init_process_group("grpc", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(initial_model())
    ddp_losses = train(ddp, rank)
    ddp_params = {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}

    sharded = initial_model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    fsdp_losses = train(sharded, rank)
    fsdp_params = {
        k: v.full_tensor().detach().clone() for k, v in sharded.named_parameters()
    }
    dist.barrier()
    dist.destroy_process_group()
    torch.save(
        {
            "ddp_losses": ddp_losses,
            "ddp_params": ddp_params,
            "fsdp2_losses": fsdp_losses,
            "fsdp2_params": fsdp_params,
        },
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
