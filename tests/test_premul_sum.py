"""ReduceOp.PREMUL_SUM: each rank multiplies its own input by its factor, then
the ranks SUM. FSDP2 reduce-scatters gradients with it once a module has a
gradient divide factor of its own (set_gradient_divide_factor, as MoE experts
get). gloo has no PREMUL_SUM, so the reference is the local float64 sum of each
rank's input times its factor.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, init_default_group, run_cases, spawn_cases
from reference import make_input, seed_of, tolerance

WORLD = 3
NUMEL = 70_001  # past direct_max_bytes: the ring schedules
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}


def _factor(rank: int) -> float:
    # At most 1, so that premultiplied inputs stay within the SUM tolerance's bounds.
    return 1.0 / (rank + 1)


def _premul_sum(rank: int, as_tensor: bool) -> dist.ReduceOp:
    factor = _factor(rank)
    # float64, so that a float64 reduction's factor is the one the reference uses.
    scalar = torch.tensor(factor, dtype=torch.float64) if as_tensor else factor
    return dist._make_nccl_premul_sum(scalar)


def _expected(numel: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    inputs = [make_input(seed_of(what, dtype), r, numel, dtype) for r in range(WORLD)]
    return sum(_factor(r) * x.double() for r, x in enumerate(inputs))  # type: ignore[return-value]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    # One more rounding per input (the premultiplication) than a plain SUM,
    # which the SUM tolerance (world**2 ulps) covers at world 3.
    rtol, atol = tolerance(actual.dtype, "SUM", WORLD)
    torch.testing.assert_close(
        actual.double(), expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def _cases(rank: int) -> dict[str, object]:
    cases: dict[str, object] = {}
    for name, dtype in DTYPES.items():
        for as_tensor in (False, True):
            factor_kind = "tensor" if as_tensor else "float"

            def all_reduce(
                dtype: torch.dtype = dtype, as_tensor: bool = as_tensor
            ) -> None:
                t = make_input(seed_of("ar", dtype), rank, NUMEL, dtype)
                dist.all_reduce(t, op=_premul_sum(rank, as_tensor))
                _assert_close(t, _expected(NUMEL, dtype, "ar"), "all_reduce")

            def reduce_scatter_tensor(
                dtype: torch.dtype = dtype, as_tensor: bool = as_tensor
            ) -> None:
                n = NUMEL // WORLD
                out = torch.empty(n, dtype=dtype)
                inp = make_input(seed_of("rs", dtype), rank, n * WORLD, dtype)
                dist.reduce_scatter_tensor(out, inp, op=_premul_sum(rank, as_tensor))
                expected = _expected(n * WORLD, dtype, "rs").narrow(0, rank * n, n)
                _assert_close(out, expected, "reduce_scatter_tensor")

            def reduce(dtype: torch.dtype = dtype, as_tensor: bool = as_tensor) -> None:
                t = make_input(seed_of("reduce", dtype), rank, NUMEL, dtype)
                before = t.clone()
                dist.reduce(t, dst=1, op=_premul_sum(rank, as_tensor))
                if rank == 1:
                    _assert_close(
                        t, _expected(NUMEL, dtype, "reduce"), "reduce at the root"
                    )
                else:
                    torch.testing.assert_close(t, before, rtol=0, atol=0)

            for op, check in (
                ("all_reduce", all_reduce),
                ("reduce_scatter_tensor", reduce_scatter_tensor),
                ("reduce", reduce),
            ):
                cases[f"{op}/{name}/{factor_kind}"] = check

    def refused_on_integers() -> None:
        t = torch.ones(4, dtype=torch.int64)
        try:
            dist.all_reduce(t, op=_premul_sum(rank, as_tensor=False))
        except RuntimeError as exc:
            assert f"allreduce on rank {rank}" in str(exc), str(exc)
            assert "PREMUL_SUM needs a floating-point tensor" in str(exc), str(exc)
            return
        raise AssertionError("PREMUL_SUM on int64 was not refused")

    cases["refused on integers"] = refused_on_integers
    return cases


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    init_default_group(ctx)
    outcomes = run_cases(_cases(ctx.rank))  # type: ignore[arg-type]
    dist.destroy_process_group()
    return outcomes


@pytest.mark.parametrize("factor", ["float", "tensor"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor", "reduce"])
def test_premul_sum(op: str, dtype: str, factor: str) -> None:
    spawn_cases(_rank_main, WORLD).assert_passed(f"{op}/{dtype}/{factor}")


def test_premul_sum_is_refused_on_integers() -> None:
    spawn_cases(_rank_main, WORLD).assert_passed("refused on integers")
