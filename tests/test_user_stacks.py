"""Users' distributed stacks, end to end on CPU, over the backend under test and gloo.

Each stack trains or runs a few steps twice in the same ranks: once over the
default group (the backend under test) and once over a gloo group, and the
results must agree; where the stack is exact enough they must also agree with
a local, single-process float64 replay. The stacks live in ``user_stacks/``.

Stacks built on a DeviceMesh (FSDP2, tensor parallelism, DCP) take the tested
mesh from ``init_device_mesh`` over the default group, as users build it, and
gloo's from ``DeviceMesh.from_group`` over the gloo group. This keeps both runs
in one spawn per world size instead of two (a spawn costs a torch import per
rank), and compares the two on the same rank, tensor by tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch.distributed as dist
from user_stacks import checkpoint, fsdp2, moe, pipelining, tensor_parallel, zero

from dist_harness import CaseReport, RankContext, init_groups, run_cases, spawn_cases

Stack = Callable[[RankContext, dist.ProcessGroup], None]

STACKS: dict[int, dict[str, Stack]] = {
    2: {
        "fsdp2_bf16": fsdp2.check,
        "fsdp2_divide_factor": fsdp2.check_divide_factor,
        "tp_sequence_parallel": tensor_parallel.check_sequence_parallel,
        "tp_compiled": tensor_parallel.check_compiled_sequence_parallel,
        "dtensor_partial_to_shard": tensor_parallel.check_partial_to_shard,
        "funcol_reduce_scatter": tensor_parallel.check_functional_reduce_scatter,
        "coalescing_manager": tensor_parallel.check_coalescing_manager,
        "pipeline_gpipe": pipelining.check_gpipe,
        "pipeline_1f1b": pipelining.check_1f1b,
        "pipeline_traced_gpipe": pipelining.check_traced_gpipe,
        "dcp_fsdp2": checkpoint.check,
        "zero_ddp": zero.check,
    },
    3: {"moe_all_to_all": moe.check},
    4: {
        "pipeline_gpipe": pipelining.check_gpipe,
        "pipeline_1f1b": pipelining.check_1f1b,
        "pipeline_traced_gpipe": pipelining.check_traced_gpipe,
    },
}


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    gloo = init_groups(ctx)
    return run_cases(
        {
            name: functools.partial(stack, ctx, gloo)
            for name, stack in STACKS[ctx.world_size].items()
        }
    )


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world, timeout_s=300)


def test_fsdp2_bf16_mixed_precision() -> None:
    _report(2).assert_passed("fsdp2_bf16")


def test_fsdp2_with_a_gradient_divide_factor() -> None:
    _report(2).assert_passed("fsdp2_divide_factor")


def test_tensor_parallel_with_sequence_parallel() -> None:
    _report(2).assert_passed("tp_sequence_parallel")


def test_tensor_parallel_under_torch_compile() -> None:
    """Inductor's graphs call the backend's collectives, forward and backward."""
    _report(2).assert_passed("tp_compiled")


def test_dtensor_partial_to_shard() -> None:
    _report(2).assert_passed("dtensor_partial_to_shard")


def test_functional_reduce_scatter_tensor() -> None:
    _report(2).assert_passed("funcol_reduce_scatter")


def test_coalescing_manager_batches() -> None:
    _report(2).assert_passed("coalescing_manager")


@pytest.mark.parametrize("world", (2, 4), ids=lambda w: f"w{w}")
@pytest.mark.parametrize("schedule", ("gpipe", "1f1b", "traced_gpipe"))
def test_pipeline_schedules(world: int, schedule: str) -> None:
    """Hand-built stages under GPipe and 1F1B; stages traced by ``pipeline`` under GPipe."""
    _report(world).assert_passed(f"pipeline_{schedule}")


def test_dcp_save_load_fsdp2_state() -> None:
    _report(2).assert_passed("dcp_fsdp2")


def test_zero_redundancy_optimizer_with_ddp() -> None:
    _report(2).assert_passed("zero_ddp")


def test_moe_uneven_all_to_all_routing() -> None:
    _report(3).assert_passed("moe_all_to_all")
