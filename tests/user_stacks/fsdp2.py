"""FSDP2 (``fully_shard``) with bf16 parameters and float32 gradient reduction,
and with a gradient divide factor of its own (which reduce-scatters with
ReduceOp.PREMUL_SUM)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from dist_harness import RankContext
from user_stacks.common import (
    FP32_TOL,
    assert_all_close,
    assert_moved,
    generator,
    tested_mesh,
)

FEATURES, HIDDEN, OUTPUTS = 8, 16, 4
BATCH = 6
STEPS = 3
LR = 0.2
POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
# Against a float64 replay, the bf16 forward and backward (8 significant bits,
# eps 2**-7) dominate: each step's gradients carry relative errors of a few
# bf16 ulps (~1e-2 of gradients below 0.1), which STEPS steps of LR turn into
# parameter errors of ~STEPS * LR * 1e-3; measured: at most 2e-4. Replaying
# with one rank's batches instead of both moves every parameter by 8e-3 or more.
BF16_VS_FP64_TOL = {"rtol": 0.0, "atol": 1e-3}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(FEATURES, HIDDEN)
        self.middle = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.middle(torch.tanh(self.inner(x)))))


def initial_net() -> Net:
    torch.manual_seed(2024)
    return Net()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(11, rank, step)
    return torch.randn(BATCH, FEATURES, generator=gen), torch.randn(
        BATCH, OUTPUTS, generator=gen
    )


# A divide factor other than the world size, as MoE experts get: FSDP2 then
# reduce-scatters with PREMUL_SUM(1 / DIVIDE_FACTOR) instead of AVG.
DIVIDE_FACTOR = 3.0


def train_fsdp2(
    mesh: DeviceMesh, rank: int, divide_factor: float | None = None
) -> dict[str, torch.Tensor]:
    """Train the sharded net on this rank's batches; return the full float32 parameters."""
    model = initial_net()
    for layer in (model.inner, model.middle, model.head):
        fully_shard(layer, mesh=mesh, mp_policy=POLICY)
    fully_shard(model, mesh=mesh, mp_policy=POLICY)
    if divide_factor is not None:
        # Each fully_shard call makes a parameter group with a factor of its own.
        for module in (model.inner, model.middle, model.head, model):
            module.set_gradient_divide_factor(divide_factor)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(rank, step)
        out = model(x)
        assert out.dtype == torch.bfloat16, out.dtype
        F.mse_loss(out.float(), y).backward()
        for name, param in model.named_parameters():
            assert isinstance(param, DTensor) and param.grad is not None, name
            assert param.grad.dtype == torch.float32, (name, param.grad.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
    full = {}
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor), name
        # Sharded on dim 0 over the mesh: each rank holds only part of it.
        assert param.to_local().shape[0] < param.shape[0], name
        full[name] = param.full_tensor().detach()
    return full


def emulated_mixed_precision(
    world: int, divide_factor: float | None = None
) -> dict[str, torch.Tensor]:
    """What FSDP2 computes, without sharding: each rank's gradient from a bf16
    copy of the float32 parameters, cast to float32, summed and divided by the
    world size (or the divide factor), then SGD in float32."""
    divisor = divide_factor if divide_factor is not None else world
    master = initial_net()
    for step in range(STEPS):
        grads: dict[str, torch.Tensor] = {}
        for rank in range(world):
            copy = initial_net().to(torch.bfloat16)
            copy.load_state_dict(
                {k: v.bfloat16() for k, v in master.state_dict().items()}
            )
            x, y = batch(rank, step)
            F.mse_loss(copy(x.bfloat16()).float(), y).backward()
            for name, param in copy.named_parameters():
                assert param.grad is not None
                grads[name] = grads.get(name, 0) + param.grad.float() / divisor
        with torch.no_grad():
            for name, param in master.named_parameters():
                param -= LR * grads[name]
    return {k: v.detach() for k, v in master.named_parameters()}


def float64_replay(
    world: int, divide_factor: float | None = None
) -> dict[str, torch.Tensor]:
    divisor = divide_factor if divide_factor is not None else world
    model = initial_net().double()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        losses = []
        for rank in range(world):
            x, y = batch(rank, step)
            losses.append(F.mse_loss(model(x.double()), y.double()))
        (torch.stack(losses).sum() / divisor).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in model.named_parameters()}


def check(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # The mesh over the default group (the backend under test), as users build
    # it; gloo's mesh wraps the gloo group, so both run in the same ranks.
    tested = train_fsdp2(tested_mesh(ctx.world_size, ctx.backend), ctx.rank)
    reference = train_fsdp2(DeviceMesh.from_group(gloo, "cpu"), ctx.rank)
    assert_all_close(tested, reference, "vs gloo", FP32_TOL)
    assert_all_close(
        tested, emulated_mixed_precision(ctx.world_size), "vs emulation", FP32_TOL
    )
    replay = float64_replay(ctx.world_size)
    assert_all_close(tested, replay, "vs float64 replay", BF16_VS_FP64_TOL)
    initial = {k: v.detach() for k, v in initial_net().named_parameters()}
    assert_moved(replay, initial, 5 * BF16_VS_FP64_TOL["atol"])


def check_divide_factor(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # gloo has no PREMUL_SUM, so the references are local only.
    world = ctx.world_size
    tested = train_fsdp2(tested_mesh(world, ctx.backend), ctx.rank, DIVIDE_FACTOR)
    emulated = emulated_mixed_precision(world, DIVIDE_FACTOR)
    assert_all_close(tested, emulated, "vs emulation", FP32_TOL)
    replay = float64_replay(world, DIVIDE_FACTOR)
    assert_all_close(tested, replay, "vs float64 replay", BF16_VS_FP64_TOL)
    # Divided by the world size instead, every tensor lands a thousand times
    # FP32_TOL's atol away: the emulation comparison tells the two apart.
    assert_moved(emulated, emulated_mixed_precision(world), 1e-3)
