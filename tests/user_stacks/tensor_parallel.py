"""DTensor tensor parallelism with sequence parallelism, and the collectives under it."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _coalescing_manager
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from dist_harness import RankContext
from user_stacks.common import (
    FP32_TOL,
    FP64_TOL,
    assert_all_close,
    assert_close,
    assert_moved,
    generator,
    tested_mesh,
)

BATCH, SEQ, MODEL, HIDDEN = 2, 12, 8, 16  # SEQ and HIDDEN divide by the world size
STEPS = 3
LR = 0.5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(MODEL)
        self.up = nn.Linear(MODEL, HIDDEN)
        self.down = nn.Linear(HIDDEN, MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def initial_block() -> Block:
    torch.manual_seed(77)
    block = Block()
    with torch.no_grad():  # LayerNorm starts at (1, 0): make its gradients matter
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    return block


def tokens(step: int) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, MODEL, generator=generator(23, step))


def train_parallel(
    mesh: DeviceMesh, rank: int, world: int, compiled: bool = False
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Steps of SGD on the full sequence, each rank holding SEQ/world of it.

    ``compiled`` runs the block through ``torch.compile(fullgraph=True)``, as
    torchtitan compiles its blocks: the collectives of the forward pass and of
    the backward pass are then ops in Inductor's graphs, not eager calls, and a
    graph break fails the check instead of hiding an eager fallback.
    """
    block = parallelize_module(
        initial_block(),
        mesh,
        {
            # LayerNorm on the local part of the sequence; its parameters are replicated.
            "norm": SequenceParallel(),
            # All-gathers the sequence, then splits the hidden features.
            "up": ColwiseParallel(input_layouts=Shard(1)),
            # Reduce-scatters the partial sums back onto the sequence dimension.
            "down": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    forward = torch.compile(block, fullgraph=True) if compiled else block
    part = SEQ // world
    outputs = []
    for step in range(STEPS):
        local_in = tokens(step)[:, rank * part : (rank + 1) * part]
        out = forward(local_in)
        assert isinstance(out, torch.Tensor) and not isinstance(out, DTensor)
        assert out.shape == (BATCH, part, MODEL), out.shape
        # The ranks' losses add up to the mean over the whole sequence.
        (out.pow(2).sum() / (BATCH * SEQ * MODEL)).backward()
        outputs.append(DTensor.from_local(out.detach(), mesh, [Shard(1)]).full_tensor())
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = {}
    for name, param in block.named_parameters():
        assert isinstance(param, DTensor), name
        params[name] = param.full_tensor().detach()
    return outputs, params


def local_replay() -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    block = initial_block().double()
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    outputs = []
    for step in range(STEPS):
        out = block(tokens(step).double())
        out.pow(2).mean().backward()
        outputs.append(out.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return outputs, {k: v.detach() for k, v in block.named_parameters()}


def _check_against_gloo_and_replay(
    tested: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
    reference: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
) -> None:
    replay_outputs, replay_params = local_replay()
    for step in range(STEPS):
        assert_close(
            tested[0][step], reference[0][step], f"step {step} vs gloo", FP32_TOL
        )
        assert_close(
            tested[0][step], replay_outputs[step], f"step {step} vs replay", FP64_TOL
        )
    assert_all_close(tested[1], reference[1], "vs gloo", FP32_TOL)
    assert_all_close(tested[1], replay_params, "vs float64 replay", FP64_TOL)
    initial = {k: v.detach() for k, v in initial_block().named_parameters()}
    assert_moved(replay_params, initial, 100 * FP64_TOL["atol"])


def check_sequence_parallel(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # The tested mesh comes from init_device_mesh over the default group, as
    # users build it; gloo's mesh wraps the gloo group, so both run in one spawn.
    tested = train_parallel(
        tested_mesh(ctx.world_size, ctx.backend), ctx.rank, ctx.world_size
    )
    reference = train_parallel(
        DeviceMesh.from_group(gloo, "cpu"), ctx.rank, ctx.world_size
    )
    _check_against_gloo_and_replay(tested, reference)


def check_compiled_sequence_parallel(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    """The same training compiled over the tested backend, against gloo's eager run."""
    tested = train_parallel(
        tested_mesh(ctx.world_size, ctx.backend),
        ctx.rank,
        ctx.world_size,
        compiled=True,
    )
    reference = train_parallel(
        DeviceMesh.from_group(gloo, "cpu"), ctx.rank, ctx.world_size
    )
    _check_against_gloo_and_replay(tested, reference)


def _rows(rank: int, world: int) -> torch.Tensor:
    return torch.randn(4 * world, 3, generator=generator(31, rank))


def _summed_rows(world: int) -> torch.Tensor:
    return sum((_rows(r, world).double() for r in range(world)), torch.zeros(1))


def _partial_to_shard(mesh: DeviceMesh, rank: int, world: int) -> torch.Tensor:
    partial = DTensor.from_local(_rows(rank, world), mesh, [Partial()])
    sharded = partial.redistribute(mesh, [Shard(0)])
    assert sharded.placements == (Shard(0),)
    replicated = sharded.redistribute(mesh, [Replicate()]).to_local()
    return torch.cat([sharded.to_local(), replicated])


def check_partial_to_shard(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    world, rank = ctx.world_size, ctx.rank
    tested = _partial_to_shard(tested_mesh(world, ctx.backend), rank, world)
    reference = _partial_to_shard(DeviceMesh.from_group(gloo, "cpu"), rank, world)
    summed = _summed_rows(world)
    expected = torch.cat([summed[rank * 4 : (rank + 1) * 4], summed])
    assert_close(tested, reference, "vs gloo", FP32_TOL)
    assert_close(tested, expected, "vs float64 sum", FP64_TOL)


def check_functional_reduce_scatter(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    world, rank = ctx.world_size, ctx.rank
    rows = _rows(rank, world)
    results = []
    for group in (dist.group.WORLD, gloo):
        assert group is not None
        # Scatter along dim 1: funcol makes the slices contiguous and reassembles them.
        wide = rows.reshape(4, world, 3).transpose(0, 1).reshape(world * 4, 3)
        out = funcol.reduce_scatter_tensor(wide.t().contiguous(), "sum", 1, group)
        results.append(funcol.wait_tensor(out).t())
        avg = funcol.reduce_scatter_tensor(rows, "avg", 0, group)
        results.append(funcol.wait_tensor(avg))
    summed = _summed_rows(world)
    mine = summed[rank * 4 : (rank + 1) * 4]
    expected_wide = summed.reshape(4, world, 3)[:, rank]
    assert_close(results[0], expected_wide, "sum along dim 1 vs float64", FP64_TOL)
    assert_close(results[1], mine / world, "avg vs float64", FP64_TOL)
    assert_close(results[0], results[2], "sum along dim 1 vs gloo", FP32_TOL)
    assert_close(results[1], results[3], "avg vs gloo", FP32_TOL)


def _coalesced(group: dist.ProcessGroup, rank: int, world: int) -> list[torch.Tensor]:
    """One coalesced batch of each kind that DTensor and FSDP issue."""
    to_reduce = [_rows(rank, world) * (i + 1) for i in range(3)]
    with _coalescing_manager(group, async_ops=True) as manager:
        for t in to_reduce:
            dist.all_reduce(t, group=group)
    manager.wait()
    scattered = [torch.zeros(4, 3) for _ in range(2)]
    with _coalescing_manager(group, async_ops=True) as manager:
        for i, out in enumerate(scattered):
            dist.reduce_scatter_tensor(out, _rows(rank, world) - i, group=group)
    manager.wait()
    gathered = [torch.zeros(world * n) for n in (2, 5)]
    with _coalescing_manager(group, async_ops=True) as manager:
        for out, n in zip(gathered, (2, 5)):
            dist.all_gather_into_tensor(
                out, torch.full((n,), rank + n / 10), group=group
            )
    manager.wait()
    return [*to_reduce, *scattered, *gathered]


def check_coalescing_manager(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    world, rank = ctx.world_size, ctx.rank
    default = dist.group.WORLD
    assert default is not None
    tested = _coalesced(default, rank, world)
    summed = _summed_rows(world)
    expected = [
        *(summed * (i + 1) for i in range(3)),
        *((summed - i * world)[rank * 4 : (rank + 1) * 4] for i in range(2)),
        *(
            torch.cat([torch.full((n,), r + n / 10) for r in range(world)])
            for n in (2, 5)
        ),
    ]
    for i, (got, want) in enumerate(zip(tested, expected, strict=True)):
        assert_close(got, want, f"tensor {i} vs float64", FP64_TOL)
    for i, (got, want) in enumerate(
        zip(tested, _coalesced(gloo, rank, world), strict=True)
    ):
        assert_close(got, want, f"tensor {i} vs gloo", FP32_TOL)
