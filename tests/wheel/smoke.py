"""Run from outside the source tree by check.sh, against the installed wheel."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_grpc_pg
from torch_grpc_pg import status  # imports the generated stubs
from torch_grpc_pg._proto import torch_grpc_pg_pb2

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int) -> None:
    dist.init_process_group(
        "grpc", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    tensor = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(tensor)
    expected = torch.arange(1000, dtype=torch.float32) * sum(range(1, WORLD + 1))
    assert torch.equal(tensor, expected), "all_reduce"
    message = torch.zeros(5)
    if rank == 0:
        dist.send(torch.full((5,), 3.0), dst=1)
    else:
        dist.recv(message, src=0)
        assert message.tolist() == [3.0] * 5, message
    dist.destroy_process_group()


def main() -> None:
    package = Path(torch_grpc_pg.__file__).resolve()
    assert "site-packages" in package.parts, f"not the installed wheel: {package}"
    assert torch_grpc_pg_pb2.DESCRIPTOR.name.endswith(".proto"), "stubs"
    assert callable(status.main)
    mp.spawn(_rank, args=(_free_port(),), nprocs=WORLD)
    print(f"wheel check passed: {package.parent}")


if __name__ == "__main__":
    main()
