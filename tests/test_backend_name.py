"""The backend's own name everywhere torch shows one, and its options."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_grpc_pg
from dist_harness import (
    CaseReport,
    RankContext,
    backend_under_test,
    init_default_group,
    run_cases,
    spawn_cases,
)

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="checks the grpc backend's own name"
)


def _names(ctx: RankContext) -> None:
    pg = dist.group.WORLD
    assert pg is not None
    assert pg.name() == "grpc", pg.name()
    assert dist.get_backend() == "grpc", dist.get_backend()
    assert pg._get_backend(torch.device("cpu")).name() == "grpc"
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(4, 3)).sum().backward()
    logged = model._get_ddp_logging_data()["backend_name"]
    assert logged == "grpc", logged


def _options(ctx: RankContext) -> None:
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    options = backend.options
    assert isinstance(options, torch_grpc_pg.Options), type(options)
    assert options.chunk_bytes == 2 << 20, options
    # A copy: changing it leaves the group's alone.
    options.chunk_bytes = 4096
    assert backend.options.chunk_bytes == 2 << 20


def _cpu_only_string(ctx: RankContext) -> None:
    group = dist.new_group(backend="cpu:grpc")
    assert group.name() == "grpc", group.name()
    tensor = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [3.0] * 3, tensor


def _options_round_trip(ctx: RankContext) -> None:
    # A group made from another's options, with one field changed.
    options = dist.group.WORLD._get_backend(torch.device("cpu")).options
    options.chunk_bytes = 4096
    group = dist.new_group(backend="grpc", pg_options=options)
    assert group._get_backend(torch.device("cpu")).options.chunk_bytes == 4096
    tensor = torch.arange(10_000, dtype=torch.float32) * (ctx.rank + 1)
    dist.all_reduce(tensor, group=group)  # many 4 KiB chunks
    expected = torch.arange(10_000, dtype=torch.float32) * 3
    assert torch.equal(tensor, expected)


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    init_default_group(ctx)
    outcomes = run_cases(
        {
            "names": lambda: _names(ctx),
            "options": lambda: _options(ctx),
            "cpu string": lambda: _cpu_only_string(ctx),
            "round trip": lambda: _options_round_trip(ctx),
        }
    )
    dist.destroy_process_group()
    return outcomes


def _report() -> CaseReport:
    return spawn_cases(_rank_main, 2)


def test_name_is_grpc_in_pg_name_get_backend_and_ddp_logging() -> None:
    _report().assert_passed("names")


def test_backend_options_returns_a_copy_of_the_groups_options() -> None:
    _report().assert_passed("options")


def test_cpu_only_backend_string_is_named_grpc() -> None:
    _report().assert_passed("cpu string")


def test_a_group_made_from_another_groups_options() -> None:
    _report().assert_passed("round trip")
