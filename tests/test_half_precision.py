"""float16 and bfloat16 reductions are bit-exact: at world 2 a reduced element is
round(float(a) op float(b)), which is exactly what torch computes for ``a op b``.

The vectorised kernels take their input straight from network buffers at any
alignment; the odd sizes make sure the scalar tails and split elements run too.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, init_groups, run_ranks

SIZES = (3, 1001, 300_007)  # scalar only; direct path; ring path with odd chunks
OPS = {
    "SUM": (dist.ReduceOp.SUM, torch.add),
    "PRODUCT": (dist.ReduceOp.PRODUCT, torch.mul),
    "MIN": (dist.ReduceOp.MIN, torch.minimum),
    "MAX": (dist.ReduceOp.MAX, torch.maximum),
}


def _inputs(dtype: torch.dtype, numel: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * numel + rank)
    # Wide magnitudes, both signs, no exact zeros (MIN/MAX of -0 and +0 may pick either).
    values = torch.randn(
        numel, generator=gen, dtype=torch.float64
    ) * 10.0 ** torch.randint(-6, 6, (numel,), generator=gen)
    values[values == 0] = 1.0
    return values.to(dtype)


def _bit_exact(ctx: RankContext) -> list[str]:
    init_groups(ctx)
    failures = []
    for dtype in (torch.bfloat16, torch.float16):
        for numel in SIZES:
            a, b = _inputs(dtype, numel, 0), _inputs(dtype, numel, 1)
            for name, (op, torch_op) in OPS.items():
                tensor = (a if ctx.rank == 0 else b).clone()
                dist.all_reduce(tensor, op=op)
                expected = torch_op(a.float(), b.float()).to(dtype)
                if not torch.equal(
                    tensor.view(torch.int16), expected.view(torch.int16)
                ):
                    wrong = int(
                        (tensor.view(torch.int16) != expected.view(torch.int16)).sum()
                    )
                    failures.append(
                        f"{dtype} {name} n={numel}: {wrong} elements differ"
                    )
    return failures


def test_half_precision_reductions_are_bit_exact() -> None:
    results = run_ranks(_bit_exact, 2)
    assert [r.value for r in results] == [[], []]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_inputs_cover_many_binades(dtype: torch.dtype) -> None:
    # Guards the test above against degenerate inputs that would make it vacuous.
    values = _inputs(dtype, 10_000, 0).float().abs()
    assert values.min() < 1e-4 < 1e4 < values.max()
