"""Deterministic per-rank inputs and independent local references for collectives.

Every rank can rebuild every other rank's input from (seed, rank), so each rank
computes the expected result of a collective by itself: in float64 for
floating dtypes, exactly in int64 for integers (inputs are bounded so that no
reduction overflows the dtype), and with logical ops for bool.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch
import torch.distributed as dist

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})

REDUCE_OPS: dict[str, dist.ReduceOp.RedOpType] = {
    "SUM": dist.ReduceOp.SUM,
    "AVG": dist.ReduceOp.AVG,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "BAND": dist.ReduceOp.BAND,
    "BOR": dist.ReduceOp.BOR,
    "BXOR": dist.ReduceOp.BXOR,
}
BITWISE_OPS = ("BAND", "BOR", "BXOR")
# Every world size the suite uses; input bounds are chosen so that reducing
# this many inputs cannot overflow.
MAX_WORLD = 4


def supported_ops(dtype: torch.dtype) -> tuple[str, ...]:
    """Ops the backend must accept for ``dtype``: AVG is float-only, bitwise ops are not."""
    if dtype in FLOAT_DTYPES:
        return ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
    return ("SUM", "PRODUCT", "MIN", "MAX", *BITWISE_OPS)


def gloo_supports(dtype: torch.dtype) -> bool:
    """Gloo (torch 2.13) rejects int16 for every collective ("Invalid scalar type")."""
    return dtype != torch.int16


def seed_of(*parts: object) -> int:
    # Python's hash() differs between processes; crc32 is the same on every rank.
    return zlib.crc32("/".join(map(str, parts)).encode())


def make_input(
    seed: int, rank: int, numel: int, dtype: torch.dtype, op: str = "SUM"
) -> torch.Tensor:
    """A contiguous 1-D input for ``rank``; its value range keeps ``op`` exact or overflow-free."""
    gen = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    if dtype in FLOAT_DTYPES:
        if op == "PRODUCT":
            # Magnitudes near 1 keep a product of 4 far from fp16 overflow/underflow.
            magnitude = 0.5 + torch.rand(numel, generator=gen, dtype=torch.float64)
            sign = torch.randint(0, 2, (numel,), generator=gen) * 2 - 1
            return (magnitude * sign).to(dtype)
        scale = 100.0 if op in ("MIN", "MAX") else 1.0
        values = torch.rand(numel, generator=gen, dtype=torch.float64) * 2 - 1
        return (values * scale).to(dtype)
    info = torch.iinfo(dtype)
    if op in ("SUM", "AVG"):
        high = info.max // MAX_WORLD
        low = 0 if info.min == 0 else -high
    elif op == "PRODUCT":
        high = math.isqrt(math.isqrt(info.max))  # high**MAX_WORLD <= max
        low = 0 if info.min == 0 else -high
    else:
        # MIN/MAX/bitwise cannot overflow: use (nearly) the whole range, sign bit included.
        low, high = info.min, info.max
    return torch.randint(low, high, (numel,), generator=gen, dtype=torch.int64).to(
        dtype
    )


def all_inputs(
    seed: int, world: int, numel: int, dtype: torch.dtype, op: str = "SUM"
) -> list[torch.Tensor]:
    return [make_input(seed, rank, numel, dtype, op) for rank in range(world)]


def reduce_reference(inputs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce the per-rank inputs locally: float64, exact int64, or bool."""
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(list(inputs)).long()
        if op in ("SUM", "MAX", "BOR"):
            return stacked.amax(0).bool()
        if op in ("PRODUCT", "MIN", "BAND"):
            return stacked.amin(0).bool()
        if op == "BXOR":
            return (stacked.sum(0) % 2).bool()
        raise ValueError(f"no bool reference for {op}")
    wide = torch.float64 if dtype in FLOAT_DTYPES else torch.int64
    stacked = torch.stack([t.to(wide) for t in inputs])
    if op == "SUM":
        return stacked.sum(0)
    if op == "AVG":
        return stacked.sum(0) / len(inputs)
    if op == "PRODUCT":
        return stacked.prod(0)
    if op == "MIN":
        return stacked.amin(0)
    if op == "MAX":
        return stacked.amax(0)
    return fold_bitwise(stacked, op)


def fold_bitwise(rows: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """BAND, BOR or BXOR of the rows, first to last."""
    combine = {
        "BAND": torch.bitwise_and,
        "BOR": torch.bitwise_or,
        "BXOR": torch.bitwise_xor,
    }[op]
    result = rows[0]
    for row in rows[1:]:
        result = combine(result, row)
    return result


def tolerance(dtype: torch.dtype, op: str, world: int) -> tuple[float, float]:
    """(rtol, atol) for a reduced float result against the float64 reference.

    A ring may round each partial sum to the dtype: W-1 roundings of at most
    half an ulp of a value bounded by W (inputs lie in [-1, 1]), plus the final
    rounding. fp16/bf16 accumulate in float32 inside the backend, so this is a
    bound, not an estimate. MIN/MAX and non-float dtypes must be exact.
    """
    if dtype not in FLOAT_DTYPES or op in ("MIN", "MAX"):
        return 0.0, 0.0
    eps = torch.finfo(dtype).eps
    if op == "SUM":
        return 0.0, world * world * eps
    if op == "AVG":
        return 0.0, world * eps
    if op == "PRODUCT":
        return 2 * world * eps, eps
    raise ValueError(f"no float tolerance for {op}")


def assert_reduced(
    actual: torch.Tensor, expected: torch.Tensor, op: str, world: int, what: str
) -> None:
    """``actual`` (in its own dtype) equals the wide ``expected`` within the dtype's tolerance."""
    rtol, atol = tolerance(actual.dtype, op, world)
    if rtol == 0.0 and atol == 0.0:
        torch.testing.assert_close(
            actual,
            expected.to(actual.dtype),
            rtol=0,
            atol=0,
            msg=lambda m: f"{what}: {m}",
        )
    else:
        torch.testing.assert_close(
            actual.double(),
            expected.double(),
            rtol=rtol,
            atol=atol,
            msg=lambda m: f"{what}: {m}",
        )


def assert_same_as_gloo(
    actual: torch.Tensor, gloo: torch.Tensor, op: str, world: int
) -> None:
    """Both backends are within the reference tolerance, hence within twice it of each other."""
    rtol, atol = tolerance(actual.dtype, op, world)
    torch.testing.assert_close(
        actual.double() if rtol or atol else actual,
        gloo.double() if rtol or atol else gloo,
        rtol=2 * rtol,
        atol=2 * atol,
        msg=lambda m: f"differs from gloo: {m}",
    )


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit-for-bit equality, for collectives that only move data."""
    torch.testing.assert_close(
        actual, expected, rtol=0, atol=0, msg=lambda m: f"{what}: {m}"
    )
