"""DistributedDataParallel trained over the backend under test matches gloo.

In each rank the same model, data and seeds train twice side by side: once
with DDP on the default group (the backend under test) and once with DDP on a
gloo group. Where DDP is exact up to float32 summation order, both are also
compared with a local, non-distributed replay of the same training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from dist_harness import (
    CaseReport,
    Check,
    RankContext,
    init_groups,
    run_cases,
    spawn_cases,
)

WORLD_SIZES = (2, 3)
STEPS = 20
LR = 0.05
BATCH = 8
BATCHES_PER_EPOCH = 4
FEATURES, HIDDEN, OUTPUTS = 16, 32, 4
# Float32 training replayed with another summation order stays this close.
FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
# With fp16_compress_hook, gradients are rounded to fp16 (eps ~1e-3) before
# they are summed, and backends may round partial sums differently: about one
# fp16 ulp of a gradient, times LR, per step. Measured differences are ~1e-5,
# while training moves parameters by ~1e-1.
FP16_HOOK_TOL = {"rtol": 1e-4, "atol": 5e-5}

Batch = tuple[torch.Tensor, torch.Tensor]


class MLP(nn.Module):
    def __init__(self, branchy: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Tanh(),
        )
        self.head = nn.Linear(HIDDEN, OUTPUTS)
        # Used on odd steps only: DDP must cope with parameters that get no gradient.
        self.odd_head = nn.Linear(HIDDEN, OUTPUTS) if branchy else None

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        hidden = self.body(x)
        if self.odd_head is not None and step % 2 == 1:
            return self.odd_head(hidden)
        return self.head(hidden)


def _initial_model(rank: int, branchy: bool = False) -> MLP:
    # Different weights on every rank: DDP's initial broadcast from rank 0 must fix that.
    torch.manual_seed(1000 + rank)
    return MLP(branchy)


def _batch(rank: int, step: int) -> Batch:
    gen = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    y = torch.randn(BATCH, OUTPUTS, generator=gen)
    return x, y


def _train_step(
    model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor
) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _local_replay(
    world: int, branchy: bool, batches: Callable[[int, int], Batch]
) -> MLP:
    """Train rank 0's initial model on every rank's batch: what DDP must reproduce."""
    model = _initial_model(0, branchy)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        # DDP averages gradients over ranks: the gradient of the mean loss.
        losses = []
        for rank in range(world):
            x, y = batches(rank, step)
            losses.append(F.mse_loss(model(x, step), y))
        _train_step(model, opt, torch.stack(losses).mean())
    return model


def _train_side_by_side(
    ctx: RankContext,
    ref: dist.ProcessGroup,
    batches: Iterator[Batch],
    *,
    branchy: bool = False,
    fp16_hook: bool = False,
) -> tuple[DDP, DDP]:
    """Train DDP over the backend under test and over gloo on the same batches."""
    ddps = []
    for group in (None, ref):
        ddp = DDP(
            _initial_model(ctx.rank, branchy),
            process_group=group,
            find_unused_parameters=branchy,
        )
        if fp16_hook:
            # The hook's state is the group it reduces over; None means WORLD.
            ddp.register_comm_hook(state=group, hook=fp16_compress_hook)
        ddps.append(ddp)
    opts = [torch.optim.SGD(ddp.parameters(), lr=LR) for ddp in ddps]
    for step in range(STEPS):
        x, y = next(batches)
        for ddp, opt in zip(ddps, opts, strict=True):
            _train_step(ddp, opt, F.mse_loss(ddp(x, step), y))
    return ddps[0], ddps[1]


def _assert_params_close(
    actual: nn.Module, expected: nn.Module, what: str, tol: dict[str, float]
) -> None:
    expected_params = dict(expected.named_parameters())
    for name, param in actual.named_parameters():
        name = name.removeprefix("module.")
        other = expected_params.get(name, expected_params.get(f"module.{name}"))
        assert other is not None, name
        torch.testing.assert_close(
            param.detach(),
            other.detach(),
            **tol,
            msg=lambda m, n=name: f"{what}, {n}: {m}",
        )


def _assert_trained(model: MLP) -> None:
    # Guards against a comparison of two models that never moved.
    initial = _initial_model(0, model.odd_head is not None)
    for (name, p), q in zip(
        model.named_parameters(), initial.parameters(), strict=True
    ):
        assert not torch.equal(p.detach(), q.detach()), f"{name} never changed"


def _step_batches(ctx: RankContext) -> Iterator[Batch]:
    for step in range(STEPS):
        yield _batch(ctx.rank, step)


def _plain(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    tested, gloo = _train_side_by_side(ctx, ref, _step_batches(ctx))
    _assert_trained(tested.module)
    _assert_params_close(tested, gloo, "vs gloo", FP32_TOL)
    _assert_params_close(
        tested.module,
        _local_replay(ctx.world_size, False, _batch),
        "vs local replay",
        FP32_TOL,
    )


def _fp16_hook(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    tested, gloo = _train_side_by_side(ctx, ref, _step_batches(ctx), fp16_hook=True)
    _assert_trained(tested.module)
    _assert_params_close(tested, gloo, "vs gloo", FP16_HOOK_TOL)
    _assert_params_close(
        tested.module,
        _local_replay(ctx.world_size, False, _batch),
        "vs local replay",
        FP16_HOOK_TOL,
    )


def _unused_parameters(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    tested, gloo = _train_side_by_side(ctx, ref, _step_batches(ctx), branchy=True)
    _assert_trained(tested.module)
    _assert_params_close(tested, gloo, "vs gloo", FP32_TOL)
    _assert_params_close(
        tested.module,
        _local_replay(ctx.world_size, True, _batch),
        "vs local replay",
        FP32_TOL,
    )


def _shard(rank: int) -> TensorDataset:
    samples = [_batch(rank, i) for i in range(BATCHES_PER_EPOCH)]
    return TensorDataset(
        torch.cat([x for x, _ in samples]), torch.cat([y for _, y in samples])
    )


def _shard_batch(rank: int, step: int) -> Batch:
    return _batch(rank, step % BATCHES_PER_EPOCH)


def _loader_batches(ctx: RankContext) -> Iterator[Batch]:
    # A new iterator each epoch forks 2 fresh workers from this rank, whose
    # gRPC threads are busy with DDP's collectives at that moment.
    loader = DataLoader(
        _shard(ctx.rank),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="fork",
    )
    step = 0
    while step < STEPS:
        for x, y in loader:
            expected_x, expected_y = _shard_batch(ctx.rank, step)
            torch.testing.assert_close(x, expected_x, rtol=0, atol=0)
            torch.testing.assert_close(y, expected_y, rtol=0, atol=0)
            yield x, y
            step += 1
            if step == STEPS:
                return


def _dataloader_workers(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    tested, gloo = _train_side_by_side(ctx, ref, _loader_batches(ctx))
    _assert_trained(tested.module)
    _assert_params_close(tested, gloo, "vs gloo", FP32_TOL)
    _assert_params_close(
        tested.module,
        _local_replay(ctx.world_size, False, _shard_batch),
        "vs local replay",
        FP32_TOL,
    )


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    ref = init_groups(ctx)
    cases: dict[str, Check] = {
        name: functools.partial(fn, ctx, ref)
        for name, fn in {
            "plain": _plain,
            "fp16_compress_hook": _fp16_hook,
            "find_unused_parameters": _unused_parameters,
            "dataloader_workers": _dataloader_workers,
        }.items()
    }
    return run_cases(cases)


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world, timeout_s=400)


WORLD = pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"w{w}")


@WORLD
def test_ddp_matches_gloo_and_local_replay(world: int) -> None:
    _report(world).assert_passed("plain")


@WORLD
def test_ddp_fp16_compress_hook(world: int) -> None:
    _report(world).assert_passed("fp16_compress_hook")


@WORLD
def test_ddp_find_unused_parameters(world: int) -> None:
    _report(world).assert_passed("find_unused_parameters")


@WORLD
def test_ddp_with_forked_dataloader_workers(world: int) -> None:
    _report(world).assert_passed("dataloader_workers")
