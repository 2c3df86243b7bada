"""all_reduce of sparse COO tensors, and DDP training a model with sparse gradients.

gloo is the oracle: the same call on the same tensors under gloo must give the
same indices and values, bit for bit, and the dense sum of every rank's tensor
(integer-valued, so exact in every dtype) must equal the result too. Ranks hold
different numbers of nonzeros (one holds none), duplicated indices, and tensors
with dense dimensions, as an embedding's gradient has.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_harness import (
    CaseReport,
    RankContext,
    backend_under_test,
    init_groups,
    run_cases,
    run_ranks,
    spawn_cases,
)
from reference import assert_equal, seed_of

WORLDS = (2, 3)
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8)
# (sparse sizes, dense sizes): a vector, an embedding's gradient, a matrix
# indexed in both dimensions, and one with two dense dimensions.
SHAPES = {
    "vector": ((12,), ()),
    "rows": ((20,), (4,)),
    "matrix": ((5, 6), ()),
    "blocks": ((4, 5), (3, 2)),
}


def _sparse_input(
    rank: int, shape: str, dtype: torch.dtype, case: str = ""
) -> torch.Tensor:
    """Rank ``rank``'s tensor: uncoalesced (indices repeat), nnz differing by rank, none on rank 1."""
    sparse, dense = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed_of("sparse", shape, dtype, case, rank))
    nnz = 0 if rank == 1 else 3 + 4 * rank
    indices = torch.stack([torch.randint(0, s, (nnz,), generator=gen) for s in sparse])
    # Small non-negative integers: every sum is exact in every dtype, uint8 included.
    values = torch.randint(0, 6, (nnz, *dense), generator=gen).to(dtype)
    return torch.sparse_coo_tensor(indices, values, (*sparse, *dense))


def _assert_same_sparse(
    actual: torch.Tensor, expected: torch.Tensor, what: str
) -> None:
    assert actual.is_sparse and expected.is_sparse, what
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    actual, expected = actual.coalesce(), expected.coalesce()
    assert_equal(actual.indices(), expected.indices(), f"{what}: indices")
    assert_equal(actual.values(), expected.values(), f"{what}: values")


def _all_reduce(
    ctx: RankContext, gloo: dist.ProcessGroup, shape: str, dtype: torch.dtype
) -> None:
    mine = _sparse_input(ctx.rank, shape, dtype)
    ours, theirs = mine.clone(), mine.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    _assert_same_sparse(ours, theirs, "differs from gloo")
    dense_sum = sum(
        _sparse_input(r, shape, dtype).to_dense().long() for r in range(ctx.world_size)
    )
    assert_equal(ours.to_dense(), dense_sum.to(dtype), "dense sum of every rank's")


def _no_nonzeros_anywhere(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    empty = torch.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 4), (20, 4)
    )
    ours, theirs = empty.clone(), empty.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    _assert_same_sparse(ours, theirs, "differs from gloo")
    assert ours.coalesce()._nnz() == 0


def _async_future(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # DDP reads a sparse gradient's sum from the work's future.
    mine = _sparse_input(ctx.rank, "rows", torch.float32, "async")
    ours, theirs = mine.clone(), mine.clone()
    work = dist.all_reduce(ours, async_op=True)
    assert work is not None
    (result,) = work.get_future().wait()
    dist.all_reduce(theirs, group=gloo)
    _assert_same_sparse(result, theirs, "the future's tensor")
    _assert_same_sparse(ours, theirs, "the tensor passed in")


def _refused(ctx: RankContext) -> None:
    # Refused at the call on every rank, so the group stays usable.
    mine = _sparse_input(ctx.rank, "vector", torch.float32)
    with pytest.raises(
        RuntimeError, match=r"sparse tensor on rank \d.*ReduceOp.SUM only"
    ):
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    flags = torch.sparse_coo_tensor(
        torch.tensor([[0, 2]]), torch.tensor([True, True]), (4,)
    )
    with pytest.raises(RuntimeError, match=r"sparse tensor on rank \d.*dtype Bool"):
        dist.all_reduce(flags)
    dense = torch.ones(3)
    dist.all_reduce(dense)
    assert dense.tolist() == [float(ctx.world_size)] * 3


class _SparseModel(nn.Module):
    """An embedding with sparse gradients beside a dense layer, as in a recommender."""

    def __init__(self, dense_trains: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 8, sparse=True)
        self.head = nn.Linear(8, 1)
        self.head.requires_grad_(dense_trains)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids)).sum(dim=1)


def _train(model: nn.Module, group: dist.ProcessGroup | None, rank: int) -> nn.Module:
    ddp = DDP(model, process_group=group)
    optimizer = torch.optim.SGD(
        [p for p in ddp.parameters() if p.requires_grad], lr=0.1
    )
    for step in range(6):
        gen = torch.Generator().manual_seed(seed_of("ids", rank, step))
        # Ranks look up different rows, some of them twice.
        ids = torch.randint(0, 50, (4, 3), generator=gen)
        optimizer.zero_grad()
        ddp(ids).square().mean().backward()
        assert ddp.module.embedding.weight.grad.is_sparse
        optimizer.step()
    return ddp.module


def _ddp_sparse_gradients(
    ctx: RankContext, gloo: dist.ProcessGroup, dense_trains: bool
) -> None:
    torch.manual_seed(7 + ctx.rank)  # DDP's initial broadcast makes the ranks agree
    initial = _SparseModel(dense_trains)
    ours = _train(_clone(initial, dense_trains), None, ctx.rank)
    theirs = _train(_clone(initial, dense_trains), gloo, ctx.rank)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        if dense_trains:
            # The dense gradients' float32 sums round in another order than
            # gloo's ring at world 3; the sparse sums do not, but later steps
            # see the dense layer's rounding.
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        else:
            assert_equal(a.detach(), b.detach(), f"{name} after training, against gloo")
    trained = ours.embedding.weight.detach()
    assert not torch.equal(trained, initial.embedding.weight.detach()), "did not train"
    # Every rank holds the same weights.
    gathered = [torch.empty_like(trained) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, trained)
    for r, weights in enumerate(gathered):
        assert_equal(weights, trained, f"embedding of rank {r}")


def _clone(model: _SparseModel, dense_trains: bool) -> _SparseModel:
    copy = _SparseModel(dense_trains)
    copy.load_state_dict(model.state_dict())
    return copy


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    gloo = init_groups(ctx)
    cases = {}
    for shape in SHAPES:
        for dtype in DTYPES:
            cases[f"all_reduce {shape} {dtype}"] = lambda s=shape, d=dtype: _all_reduce(
                ctx, gloo, s, d
            )
    cases["no nonzeros"] = lambda: _no_nonzeros_anywhere(ctx, gloo)
    cases["async future"] = lambda: _async_future(ctx, gloo)
    if ctx.backend == "grpc":
        cases["refused"] = lambda: _refused(ctx)
    cases["ddp sparse only"] = lambda: _ddp_sparse_gradients(ctx, gloo, False)
    cases["ddp sparse and dense"] = lambda: _ddp_sparse_gradients(ctx, gloo, True)
    outcomes = run_cases(cases)
    dist.destroy_process_group()
    return outcomes


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sparse_all_reduce_matches_gloo(
    world: int, shape: str, dtype: torch.dtype
) -> None:
    _report(world).assert_passed(f"all_reduce {shape} {dtype}")


@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce_of_tensors_without_nonzeros(world: int) -> None:
    _report(world).assert_passed("no nonzeros")


@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce_future_holds_the_sum(world: int) -> None:
    _report(world).assert_passed("async future")


@pytest.mark.skipif(
    backend_under_test() != "grpc", reason="checks the grpc backend's messages"
)
@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce_refuses_ops_and_dtypes_at_the_call(world: int) -> None:
    _report(world).assert_passed("refused")


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_trains_a_sparse_embedding_exactly_as_gloo(world: int) -> None:
    _report(world).assert_passed("ddp sparse only")


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_trains_sparse_and_dense_parameters_as_gloo(world: int) -> None:
    _report(world).assert_passed("ddp sparse and dense")


def _mismatched_sizes(ctx: RankContext) -> str:
    init_groups(ctx)
    size = 10 if ctx.rank == 0 else 11
    tensor = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.tensor([1.0]), (size,))
    with pytest.raises(RuntimeError) as raised:
        dist.all_reduce(tensor)
    return str(raised.value)


@pytest.mark.skipif(
    backend_under_test() != "grpc", reason="checks the grpc backend's message"
)
@pytest.mark.parametrize("world", WORLDS)
def test_sparse_tensors_of_different_sizes_fail_on_every_rank(world: int) -> None:
    for res in run_ranks(_mismatched_sizes, world):
        assert "of size [10]" in res.value and "of size [11]" in res.value, (
            res.rank,
            res.value,
        )
