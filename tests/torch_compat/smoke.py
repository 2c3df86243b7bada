"""The smoke subset that tests/torch_compat/check.sh runs against another torch release.

World 2: all_reduce, broadcast, all_gather, barrier, send/recv and uneven
all_to_all_single on the grpc group, each compared with the same call on a
gloo group, and the group's name. Only what gloo supports in every
release of the declared range (gloo has no ReduceOp.AVG in torch 2.7), so that
a failure means the grpc backend differs. Not named test_*: ``make test``
runs the full suite instead; check.sh names this file.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    Check,
    RankContext,
    init_groups,
    run_cases,
    spawn_cases,
)

WORLD = 2
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)
# Past direct_max_bytes (64 KiB), so the ring path runs too.
NUMELS = (7, 40_000)


def _input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    # Small values keep PRODUCT exact in half precision.
    return ((torch.arange(numel) + rank) % 3 + 1).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.equal(got, want), (
        f"{what}: grpc {got.flatten()[:8]} gloo {want.flatten()[:8]}"
    )


def _all_reduce(
    ctx: RankContext, ref: dist.ProcessGroup, dtype: torch.dtype, op: object, numel: int
) -> None:
    ours = _input(ctx.rank, numel, dtype)
    gloo = ours.clone()
    dist.all_reduce(ours, op=op)
    dist.all_reduce(gloo, op=op, group=ref)
    _same(ours, gloo, "all_reduce")


def _broadcast(
    ctx: RankContext, ref: dist.ProcessGroup, dtype: torch.dtype, numel: int
) -> None:
    for root in range(ctx.world_size):
        ours = _input(ctx.rank, numel, dtype)
        gloo = ours.clone()
        dist.broadcast(ours, src=root)
        dist.broadcast(gloo, src=root, group=ref)
        _same(ours, gloo, f"broadcast from {root}")


def _all_gather(
    ctx: RankContext, ref: dist.ProcessGroup, dtype: torch.dtype, numel: int
) -> None:
    mine = _input(ctx.rank, numel, dtype)
    ours = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    gloo = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(ours, mine)
    dist.all_gather(gloo, mine, group=ref)
    for rank, (a, b) in enumerate(zip(ours, gloo)):
        _same(a, b, f"all_gather block {rank}")


def _name() -> None:
    group = dist.group.WORLD
    assert group is not None and group.name() == "grpc", group


def _send_recv(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    peer = 1 - ctx.rank
    for group in (None, ref):
        out = torch.zeros(1000)
        ops = [
            dist.P2POp(dist.irecv, out, peer, group),
            dist.P2POp(dist.isend, _input(ctx.rank, 1000, torch.float32), peer, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _same(out, _input(peer, 1000, torch.float32), f"message from {peer}")


def _uneven_all_to_all(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    send_splits = [1 + ctx.rank, 3]
    recv_splits = [[1, 3][ctx.rank], [2, 3][ctx.rank]]
    mine = _input(ctx.rank, sum(send_splits), torch.float32)
    ours = torch.zeros(sum(recv_splits))
    gloo = torch.zeros(sum(recv_splits))
    dist.all_to_all_single(ours, mine, recv_splits, send_splits)
    dist.all_to_all_single(gloo, mine, recv_splits, send_splits, group=ref)
    _same(ours, gloo, "uneven all_to_all_single")


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    ref = init_groups(ctx)
    cases: dict[str, Check] = {}
    for dtype in DTYPES:
        for numel in NUMELS:
            name = f"{dtype}/n{numel}"
            for op in OPS:
                cases[f"all_reduce/{name}/{op}"] = functools.partial(
                    _all_reduce, ctx, ref, dtype, op, numel
                )
            cases[f"broadcast/{name}"] = functools.partial(
                _broadcast, ctx, ref, dtype, numel
            )
            cases[f"all_gather/{name}"] = functools.partial(
                _all_gather, ctx, ref, dtype, numel
            )
    cases["barrier/"] = dist.barrier
    cases["name/"] = _name
    cases["send_recv/"] = functools.partial(_send_recv, ctx, ref)
    cases["all_to_all/"] = functools.partial(_uneven_all_to_all, ctx, ref)
    return run_cases(cases)


def _report() -> CaseReport:
    return spawn_cases(_rank_main, WORLD, timeout_s=300)


def test_all_reduce() -> None:
    _report().assert_passed("all_reduce/")


def test_broadcast() -> None:
    _report().assert_passed("broadcast/")


def test_all_gather() -> None:
    _report().assert_passed("all_gather/")


def test_barrier() -> None:
    _report().assert_passed("barrier/")


def test_name() -> None:
    _report().assert_passed("name/")


def test_send_recv() -> None:
    _report().assert_passed("send_recv/")


def test_uneven_all_to_all() -> None:
    _report().assert_passed("all_to_all/")
