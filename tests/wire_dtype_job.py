"""One rank of tests/test_wire_dtype.py: every op that wire_dtype touches, and some it must not.

    RANK=r WORLD_SIZE=w MASTER_ADDR=... MASTER_PORT=... python tests/wire_dtype_job.py OUT

Runs each case of CASES on inputs from ``make_input`` (the test recomputes them) and
saves what this rank ended with to OUT/rank{r}.pt. The backend's settings come from the
environment (TORCH_GRPC_PG_WIRE_DTYPE, TORCH_GRPC_PG_CHUNK_BYTES).
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

# Sizes in elements. Direct allreduce and broadcast at or below direct_max_bytes (64 KiB),
# the ring or two-level schedules above; with 64 KiB chunks the large ones span many.
SMALL = 1_000
LARGE = 300_007
MEDIUM = 50_001


def make_input(case: str, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input to ``case``: normal values scaled by 2^-4 to 2^4."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    scale = torch.exp2(torch.randint(-4, 5, (n,), generator=gen).double())
    values = torch.randn(n, generator=gen, dtype=torch.float64) * scale
    if dtype.is_floating_point:
        return values.to(dtype)
    return (values * 1000).round().to(dtype)


def _all_reduce(
    n: int,
    dtype: torch.dtype = torch.float32,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
) -> Callable[[str, int, int], torch.Tensor]:
    def run(case: str, rank: int, world: int) -> torch.Tensor:
        t = make_input(case, rank, n, dtype)
        dist.all_reduce(t, op=op)
        return t

    return run


def _broadcast(case: str, rank: int, world: int) -> torch.Tensor:
    t = make_input(case, rank, MEDIUM, torch.float32)
    dist.broadcast(t, src=world - 1)
    return t


def _all_gather_into_tensor(case: str, rank: int, world: int) -> torch.Tensor:
    t = make_input(case, rank, MEDIUM, torch.float32)
    out = torch.empty(world * MEDIUM)
    dist.all_gather_into_tensor(out, t)
    return out


def _all_gather(case: str, rank: int, world: int) -> torch.Tensor:
    t = make_input(case, rank, SMALL, torch.float32)
    outs = [torch.empty(SMALL) for _ in range(world)]
    dist.all_gather(outs, t)
    return torch.cat(outs)


def _reduce_scatter_tensor(case: str, rank: int, world: int) -> torch.Tensor:
    t = make_input(case, rank, world * MEDIUM, torch.float32)
    out = torch.empty(MEDIUM)
    dist.reduce_scatter_tensor(out, t)
    return out


CASES: dict[str, Callable[[str, int, int], torch.Tensor]] = {
    "all_reduce_small": _all_reduce(SMALL),
    "all_reduce_large": _all_reduce(LARGE),
    "all_reduce_avg": _all_reduce(MEDIUM, op=dist.ReduceOp.AVG),
    "all_reduce_max": _all_reduce(MEDIUM, op=dist.ReduceOp.MAX),
    "broadcast": _broadcast,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_gather": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    # Not float32: these move and reduce exactly as without wire_dtype.
    "all_reduce_float64": _all_reduce(MEDIUM, torch.float64),
    "all_reduce_bfloat16": _all_reduce(MEDIUM, torch.bfloat16),
    "all_reduce_int64": _all_reduce(MEDIUM, torch.int64),
}


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    import torch_grpc_pg  # noqa: F401  (registers the backend)

    dist.init_process_group("grpc", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {case: run(case, rank, world) for case, run in CASES.items()}
    dist.barrier()
    dist.destroy_process_group()
    torch.save(results, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
