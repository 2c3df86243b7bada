"""send, recv (also from any source), isend, irecv and batch_isend_irecv.

Every message is checked exactly against what its sender holds, and each
pattern runs under gloo too, with the same result.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    RankContext,
    init_groups,
    run_cases,
    spawn_cases,
)
from layouts import MEDIUM_NUMEL, ODD_NUMEL, TRANSPOSED_SHAPE
from reference import assert_equal, make_input, seed_of

DTYPES = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.uint8,
    torch.bool,
)
# Past what a peer's queue and its HTTP/2 window hold (8 chunks of 2 MiB + 16
# MiB), so an unreceived message holds its stream back.
BLOCKING_NUMEL = 12 << 20


def _message(
    src: int, dst: int, numel: int, dtype: torch.dtype, what: str
) -> torch.Tensor:
    return make_input(seed_of("p2p", what, dst), src, numel, dtype)


def _ring_shift(
    ctx: RankContext,
    group: dist.ProcessGroup | None,
    numel: int,
    dtype: torch.dtype,
    what: str,
) -> torch.Tensor:
    """Each rank sends to the next and receives from the previous, receives posted first."""
    nxt, prv = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    out = torch.zeros(numel, dtype=dtype)
    ops = [
        dist.P2POp(dist.irecv, out, prv, group),
        dist.P2POp(dist.isend, _message(ctx.rank, nxt, numel, dtype, what), nxt, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


def _ring_case(
    ctx: RankContext, gloo: dist.ProcessGroup, numel: int, dtype: torch.dtype
) -> None:
    what = f"ring {numel} {dtype}"
    prv = (ctx.rank - 1) % ctx.world_size
    got = _ring_shift(ctx, None, numel, dtype, what)
    assert_equal(got, _message(prv, ctx.rank, numel, dtype, what), what)
    assert_equal(
        got, _ring_shift(ctx, gloo, numel, dtype, what), f"{what}: differs from gloo"
    )


def _blocking_send_recv(ctx: RankContext) -> None:
    # Rank 0 sends to every other rank in turn; each answers with its own.
    if ctx.rank == 0:
        for peer in range(1, ctx.world_size):
            dist.send(
                _message(0, peer, ODD_NUMEL, torch.float32, "blocking"), dst=peer, tag=7
            )
            back = torch.zeros(ODD_NUMEL)
            dist.recv(back, src=peer, tag=8)
            assert_equal(
                back,
                _message(peer, 0, ODD_NUMEL, torch.float32, "blocking"),
                f"answer of {peer}",
            )
    else:
        got = torch.zeros(ODD_NUMEL)
        dist.recv(got, src=0, tag=7)
        assert_equal(
            got,
            _message(0, ctx.rank, ODD_NUMEL, torch.float32, "blocking"),
            "from rank 0",
        )
        dist.send(
            _message(ctx.rank, 0, ODD_NUMEL, torch.float32, "blocking"), dst=0, tag=8
        )


def _any_source(ctx: RankContext) -> None:
    # Rank 0 takes one message from every peer, in whatever order they come.
    if ctx.rank == 0:
        seen = set()
        for _ in range(1, ctx.world_size):
            got = torch.zeros(ODD_NUMEL)
            sender = dist.recv(got)
            assert sender not in seen and 0 < sender < ctx.world_size, sender
            seen.add(sender)
            assert_equal(
                got,
                _message(sender, 0, ODD_NUMEL, torch.float32, "any"),
                f"from {sender}",
            )
    else:
        dist.send(_message(ctx.rank, 0, ODD_NUMEL, torch.float32, "any"), dst=0)


def _non_contiguous(ctx: RankContext) -> None:
    if ctx.world_size < 2 or ctx.rank > 1:
        return
    base = _message(
        0, 1, TRANSPOSED_SHAPE[0] * TRANSPOSED_SHAPE[1], torch.float32, "strided"
    )
    if ctx.rank == 0:
        dist.send(base.view(TRANSPOSED_SHAPE).t(), dst=1)
    else:
        storage = torch.full((TRANSPOSED_SHAPE[0] + 2, TRANSPOSED_SHAPE[1]), -1.0)
        view = storage[1:-1].t()  # non-contiguous, with storage around it
        dist.recv(view, src=0)
        assert_equal(
            view.contiguous(),
            base.view(TRANSPOSED_SHAPE).t().contiguous(),
            "transposed",
        )
        assert bool((storage[0] == -1).all() and (storage[-1] == -1).all()), (
            "storage outside the view changed"
        )


def _large_message_does_not_hold_back_collectives(ctx: RankContext) -> None:
    # Rank 0's message fills its stream to rank 1 long before rank 1 receives
    # it; the all_reduce between them must still go through.
    if ctx.rank == 0:
        big = _message(0, 1, BLOCKING_NUMEL, torch.float32, "big")
        work = dist.isend(big, dst=1)
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    assert total.item() == ctx.world_size * (ctx.world_size + 1) / 2, total
    if ctx.rank == 0:
        work.wait()
    elif ctx.rank == 1:
        got = torch.zeros(BLOCKING_NUMEL)
        dist.recv(got, src=0)
        assert_equal(
            got, _message(0, 1, BLOCKING_NUMEL, torch.float32, "big"), "big message"
        )


def _interleaved_with_collectives(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    # Messages and collectives issued back to back, asynchronously, many times.
    nxt, prv = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    for step in range(20):
        out = torch.zeros(MEDIUM_NUMEL // 10)
        recv = dist.irecv(out, src=prv, tag=step)
        send = dist.isend(
            _message(ctx.rank, nxt, MEDIUM_NUMEL // 10, torch.float32, f"mix {step}"),
            nxt,
            tag=step,
        )
        summed = torch.full((5,), float(ctx.rank + step))
        reference = summed.clone()
        reduced = dist.all_reduce(summed, async_op=True)
        dist.all_reduce(reference, group=gloo)
        for work in (recv, send, reduced):
            work.wait()
        assert_equal(
            out,
            _message(prv, ctx.rank, MEDIUM_NUMEL // 10, torch.float32, f"mix {step}"),
            f"step {step}",
        )
        assert_equal(summed, reference, f"all_reduce at step {step}")


def _objects(ctx: RankContext) -> None:
    if ctx.rank == 0:
        dist.send_object_list([{"step": 3, "name": "grpc"}, [1, 2.5]], dst=1)
    elif ctx.rank == 1:
        objects: list[object] = [None, None]
        dist.recv_object_list(objects, src=0)
        assert objects == [{"step": 3, "name": "grpc"}, [1, 2.5]], objects


def _p2p_rank_main(ctx: RankContext) -> dict[str, str | None]:
    gloo = init_groups(ctx)
    cases = {}
    for dtype in DTYPES:
        for numel in (0, 1, ODD_NUMEL, MEDIUM_NUMEL):
            cases[f"ring {dtype} {numel}"] = lambda d=dtype, n=numel: _ring_case(
                ctx, gloo, n, d
            )
    cases["blocking send recv"] = lambda: _blocking_send_recv(ctx)
    cases["any source"] = lambda: _any_source(ctx)
    cases["non contiguous"] = lambda: _non_contiguous(ctx)
    cases["large message"] = lambda: _large_message_does_not_hold_back_collectives(ctx)
    cases["interleaved"] = lambda: _interleaved_with_collectives(ctx, gloo)
    cases["objects"] = lambda: _objects(ctx)
    outcomes = run_cases(cases)
    dist.destroy_process_group()
    return outcomes


def _report(world: int) -> CaseReport:
    return spawn_cases(_p2p_rank_main, world)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ring_shift_with_batch_isend_irecv(world: int, dtype: torch.dtype) -> None:
    _report(world).assert_passed(f"ring {dtype} ")


@pytest.mark.parametrize("world", [2, 3])
def test_blocking_send_and_recv_with_tags(world: int) -> None:
    _report(world).assert_passed("blocking send recv")


@pytest.mark.parametrize("world", [2, 3])
def test_recv_from_any_source_names_the_sender(world: int) -> None:
    _report(world).assert_passed("any source")


def test_non_contiguous_send_and_recv() -> None:
    _report(2).assert_passed("non contiguous")


@pytest.mark.parametrize("world", [2, 3])
def test_unreceived_message_does_not_hold_back_collectives(world: int) -> None:
    _report(world).assert_passed("large message")


@pytest.mark.parametrize("world", [2, 3])
def test_messages_interleaved_with_collectives(world: int) -> None:
    _report(world).assert_passed("interleaved")


def test_send_and_recv_object_list() -> None:
    _report(2).assert_passed("objects")
