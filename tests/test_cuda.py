"""CUDA tensors go through pinned host memory; results land back on the device, in stream order."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, backend_under_test, init_groups, run_ranks
from reference import (
    all_inputs,
    assert_equal,
    assert_reduced,
    reduce_reference,
    seed_of,
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        backend_under_test() != "grpc", reason="tests the grpc backend's staging"
    ),
]


def _cuda_collectives(ctx: RankContext) -> str:
    device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    init_groups(ctx)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        inputs = all_inputs(seed_of("cuda", dtype), ctx.world_size, 1 << 20, dtype)
        # Queue work on the current stream first: the collective must see its result.
        tensor = torch.zeros_like(inputs[ctx.rank], device=device)
        tensor.add_(inputs[ctx.rank].to(device, non_blocking=True))
        dist.all_reduce(tensor)
        assert tensor.device == device
        assert_reduced(
            tensor.cpu(),
            reduce_reference(inputs, "SUM"),
            "SUM",
            ctx.world_size,
            f"allreduce {dtype}",
        )

        column = torch.stack([inputs[ctx.rank]] * 3, dim=1).to(device)[
            :, 1
        ]  # non-contiguous
        dist.broadcast(column, src=ctx.world_size - 1)
        assert_equal(column.cpu(), inputs[ctx.world_size - 1], f"broadcast {dtype}")

        gathered = torch.empty(
            ctx.world_size * inputs[0].numel(), dtype=dtype, device=device
        )
        dist.all_gather_into_tensor(gathered, inputs[ctx.rank].to(device))
        assert_equal(gathered.cpu(), torch.cat(inputs), f"allgather {dtype}")
    return "ok"


@pytest.mark.parametrize("world_size", [1, 2])
def test_cuda_tensors(world_size: int) -> None:
    assert [r.value for r in run_ranks(_cuda_collectives, world_size)] == [
        "ok"
    ] * world_size
