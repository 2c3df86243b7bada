"""Dtypes beyond the ten that gloo knows: float8, float4 and complex tensors are moved
bit for bit (broadcast, gathers, scatter, all-to-all, send and receive) and
refused by reductions (except a complex all_reduce, which torch turns into a
real one), and uint16, uint32 and uint64 are reduced too.

gloo rejects every one of these dtypes, so the references are local: the bytes
each rank put in, rebuilt from (seed, rank), and for the unsigned reductions the
same reduction computed on each value's bit pattern in the signed dtype of its
width. World 3, so that the ring has an odd length; 70,001 elements put every
dtype past ``direct_max_bytes`` onto the ring schedules.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, init_default_group, run_cases, spawn_cases
from reference import fold_bitwise, make_input, seed_of, tolerance

WORLD = 3
NUMELS = (7, 70_001)
MOVE_ONLY = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
    "float8_e5m2fnuz": torch.float8_e5m2fnuz,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
    "float4_e2m1fn_x2": torch.float4_e2m1fn_x2,
    "complex32": torch.complex32,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
REAL_OF = {
    torch.complex32: torch.float16,
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
}
UNSIGNED = {"uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64}
SIGNED_OF_WIDTH = {
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}
MOVED = {**MOVE_ONLY, **UNSIGNED}


def _bytes_of(rank: int, numel: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    """``numel`` elements of random bits: every pattern, NaNs and infinities included."""
    size = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(seed_of(what, rank, numel, dtype))
    return torch.randint(
        0, 256, (numel * size,), generator=gen, dtype=torch.uint8
    ).view(dtype)


def _assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    a, e = (
        actual.contiguous().view(torch.uint8),
        expected.contiguous().view(torch.uint8),
    )
    if not torch.equal(a, e):
        wrong = int((a != e).sum())
        raise AssertionError(f"{what}: {wrong} of {a.numel()} bytes differ")


def _moves(dtype: torch.dtype, numel: int) -> dict[str, object]:
    rank = dist.get_rank()
    mine = functools.partial(_bytes_of, numel=numel, dtype=dtype)

    def broadcast() -> None:
        for root in range(WORLD):
            t = mine(rank, what="broadcast").clone()
            dist.broadcast(t, src=root)
            _assert_bits_equal(
                t, mine(root, what="broadcast"), f"broadcast from {root}"
            )

    def broadcast_into_a_strided_view() -> None:
        # Every other element of a buffer twice as long: packed and unpacked on the way.
        def buffer(r: int) -> torch.Tensor:
            return _bytes_of(r, 2 * numel, dtype, "strided")

        mine_buffer = buffer(rank).clone()
        dist.broadcast(mine_buffer[::2], src=1)
        _assert_bits_equal(
            mine_buffer[::2], buffer(1)[::2], "broadcast into every other element"
        )
        _assert_bits_equal(
            mine_buffer[1::2], buffer(rank)[1::2], "the elements between, untouched"
        )

    def all_gather_into_tensor() -> None:
        out = torch.empty(WORLD * numel, dtype=dtype)
        dist.all_gather_into_tensor(out, mine(rank, what="gather"))
        expected = torch.cat(
            [mine(r, what="gather").view(torch.uint8) for r in range(WORLD)]
        )
        _assert_bits_equal(out, expected.view(dtype), "all_gather_into_tensor")

    def all_gather() -> None:
        outs = [torch.empty(numel, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(outs, mine(rank, what="gather"))
        for r, out in enumerate(outs):
            _assert_bits_equal(
                out, mine(r, what="gather"), f"all_gather, rank {r}'s block"
            )

    def all_to_all_single_uneven() -> None:
        # Rank s sends s + d + 1 elements to rank d (numel of them at most).
        def split(s: int, d: int) -> int:
            return min(numel, s + d + 1)

        sent = torch.cat(
            [
                mine(rank, what=f"a2a to {d}")[: split(rank, d)].view(torch.uint8)
                for d in range(WORLD)
            ]
        ).view(dtype)
        received = torch.empty(sum(split(s, rank) for s in range(WORLD)), dtype=dtype)
        dist.all_to_all_single(
            received,
            sent,
            output_split_sizes=[split(s, rank) for s in range(WORLD)],
            input_split_sizes=[split(rank, d) for d in range(WORLD)],
        )
        expected = torch.cat(
            [
                mine(s, what=f"a2a to {rank}")[: split(s, rank)].view(torch.uint8)
                for s in range(WORLD)
            ]
        ).view(dtype)
        _assert_bits_equal(received, expected, "all_to_all_single")

    def scatter_and_gather() -> None:
        root = 2
        out = torch.empty(numel, dtype=dtype)
        blocks = (
            [mine(r, what="scatter") for r in range(WORLD)] if rank == root else None
        )
        dist.scatter(out, blocks, src=root)
        _assert_bits_equal(out, mine(rank, what="scatter"), "scatter")
        gathered = (
            [torch.empty(numel, dtype=dtype) for _ in range(WORLD)]
            if rank == root
            else None
        )
        dist.gather(mine(rank, what="gather to root"), gathered, dst=root)
        if gathered is not None:
            for r, block in enumerate(gathered):
                _assert_bits_equal(
                    block, mine(r, what="gather to root"), f"gather, rank {r}'s block"
                )

    def send_and_recv_around_the_ring() -> None:
        got = torch.empty(numel, dtype=dtype)
        ops = [
            dist.P2POp(dist.isend, mine(rank, what="p2p"), (rank + 1) % WORLD),
            dist.P2POp(dist.irecv, got, (rank - 1) % WORLD),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _assert_bits_equal(
            got, mine((rank - 1) % WORLD, what="p2p"), "recv from the previous rank"
        )

    return {
        "broadcast": broadcast,
        "broadcast_into_a_strided_view": broadcast_into_a_strided_view,
        "all_gather_into_tensor": all_gather_into_tensor,
        "all_gather": all_gather,
        "all_to_all_single_uneven": all_to_all_single_uneven,
        "scatter_and_gather": scatter_and_gather,
        "send_and_recv_around_the_ring": send_and_recv_around_the_ring,
    }


def _refused_reductions(name: str, dtype: torch.dtype) -> dict[str, object]:
    rank = dist.get_rank()
    expected = f"on rank {rank}: the grpc backend moves {name} tensors"

    def expect_refusal(call: object, what: str) -> None:
        try:
            call()  # type: ignore[operator]
        except RuntimeError as exc:
            if expected not in str(exc) or "does not reduce them" not in str(exc):
                raise AssertionError(f"{what}: unexpected message: {exc}") from exc
            return
        raise AssertionError(f"{what} on {name} was not refused")

    def all_reduce() -> None:
        if dtype in REAL_OF:
            # torch itself reduces complex tensors as real pairs before the
            # backend sees them; the result must still be right.
            real = REAL_OF[dtype]
            seed = seed_of("complex all_reduce", dtype)
            inputs = [
                make_input(seed, r, 2 * 8, real).view(dtype) for r in range(WORLD)
            ]
            t = inputs[rank].clone()
            dist.all_reduce(t)
            expected = torch.stack([x.view(real).double() for x in inputs]).sum(0)
            rtol, atol = tolerance(real, "SUM", WORLD)
            torch.testing.assert_close(
                t.view(real).double(), expected, rtol=rtol, atol=atol
            )
            return
        t = _bytes_of(rank, 8, dtype, "refused")
        before = t.clone()
        expect_refusal(lambda: dist.all_reduce(t), "all_reduce")
        _assert_bits_equal(t, before, "a refused all_reduce left its tensor as it was")

    def reduce_scatter_tensor() -> None:
        out = torch.empty(4, dtype=dtype)
        expect_refusal(
            lambda: dist.reduce_scatter_tensor(
                out, _bytes_of(rank, 4 * WORLD, dtype, "rs")
            ),
            "reduce_scatter_tensor",
        )

    def reduce() -> None:
        expect_refusal(
            lambda: dist.reduce(_bytes_of(rank, 8, dtype, "r"), dst=0), "reduce"
        )

    def the_group_still_works() -> None:
        t = torch.full((3,), float(rank))
        dist.all_reduce(t)
        torch.testing.assert_close(t, torch.full((3,), float(sum(range(WORLD)))))

    return {
        "all_reduce": all_reduce,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "reduce": reduce,
        "the_group_still_works": the_group_still_works,
    }


# ---------------------------------------------------------------- unsigned reductions

UNSIGNED_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _unsigned_input(rank: int, numel: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Bit patterns in the signed dtype of the same width, as ``dtype``.

    SUM and PRODUCT stay below what would carry into the sign bit of the signed
    dtype, so that the reference computes them without wrapping; MIN, MAX and the
    bitwise ops get every pattern, high bit included, where signedness shows.
    """
    signed = SIGNED_OF_WIDTH[dtype]
    info = torch.iinfo(signed)
    gen = torch.Generator().manual_seed(seed_of("unsigned", rank, numel, dtype, op))
    if op == "SUM":
        low, high = 0, info.max // WORLD
    elif op == "PRODUCT":
        high = int(info.max ** (1 / WORLD))
        while high**WORLD > info.max:
            high -= 1
        low = 0
    else:
        low, high = info.min, info.max
    values = torch.randint(low, high, (numel,), generator=gen, dtype=torch.int64)
    return values.to(signed).view(dtype)


def _unsigned_reference(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of unsigned values, on their signed bit patterns."""
    dtype = inputs[0].dtype
    signed = SIGNED_OF_WIDTH[dtype]
    rows = torch.stack([t.view(signed) for t in inputs])
    if op in ("MIN", "MAX"):
        # Unsigned order is signed order with the top bit flipped.
        flip = torch.iinfo(signed).min
        flipped = rows ^ flip
        reduced = flipped.amin(0) if op == "MIN" else flipped.amax(0)
        return (reduced ^ flip).view(dtype)
    if op == "SUM":
        return rows.sum(0, dtype=signed).view(dtype)
    if op == "PRODUCT":
        return rows.prod(0, dtype=signed).view(dtype)
    return fold_bitwise(rows, op).view(dtype)


def _unsigned_reductions(dtype: torch.dtype, numel: int) -> dict[str, object]:
    rank = dist.get_rank()
    cases: dict[str, object] = {}
    for op in UNSIGNED_OPS:

        def check(op: str = op) -> None:
            inputs = [_unsigned_input(r, numel, dtype, op) for r in range(WORLD)]
            t = inputs[rank].clone()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            _assert_bits_equal(t, _unsigned_reference(inputs, op), f"all_reduce {op}")

        cases[op] = check
    return cases


def _all_cases(ctx: RankContext) -> dict[str, str | None]:
    init_default_group(ctx)
    cases: dict[str, object] = {}
    for name, dtype in MOVED.items():
        for numel in NUMELS:
            for case, check in _moves(dtype, numel).items():
                cases[f"moves/{name}/{numel}/{case}"] = check
    for name, dtype in MOVE_ONLY.items():
        for case, check in _refused_reductions(name, dtype).items():
            cases[f"refused/{name}/{case}"] = check
    for name, dtype in UNSIGNED.items():
        for numel in NUMELS:
            for op, check in _unsigned_reductions(dtype, numel).items():
                cases[f"reduced/{name}/{numel}/{op}"] = check
    outcomes = run_cases(cases)  # type: ignore[arg-type]
    dist.destroy_process_group()
    return outcomes


@pytest.mark.parametrize("numel", NUMELS)
@pytest.mark.parametrize("dtype", list(MOVED))
def test_moved_bit_for_bit(dtype: str, numel: int) -> None:
    spawn_cases(_all_cases, WORLD).assert_passed(f"moves/{dtype}/{numel}/")


@pytest.mark.parametrize("dtype", list(MOVE_ONLY))
def test_reductions_refuse_move_only_dtypes_at_the_call(dtype: str) -> None:
    spawn_cases(_all_cases, WORLD).assert_passed(f"refused/{dtype}/")


@pytest.mark.parametrize("numel", NUMELS)
@pytest.mark.parametrize("dtype", list(UNSIGNED))
def test_unsigned_reductions(dtype: str, numel: int) -> None:
    spawn_cases(_all_cases, WORLD).assert_passed(f"reduced/{dtype}/{numel}/")


@pytest.mark.parametrize("dtype", list(UNSIGNED))
def test_unsigned_inputs_set_the_high_bit(dtype: str) -> None:
    # Guards the MIN/MAX cases above: without values past the signed maximum,
    # a kernel that compared signed would pass them.
    signed = SIGNED_OF_WIDTH[UNSIGNED[dtype]]
    bits = _unsigned_input(0, 1000, UNSIGNED[dtype], "MIN").view(signed)
    assert (bits < 0).any() and (bits > 0).any()
