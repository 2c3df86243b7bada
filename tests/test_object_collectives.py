"""all_gather_object and broadcast_object_list over the backend under test.

torch implements both with a size exchange followed by a byte-tensor
collective of unequal payloads, so objects of different sizes per rank
(including one large enough for the ring path) are the interesting input.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
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

WORLD_SIZES = (1, 2, 3)


def _object_of(rank: int, salt: str) -> dict[str, Any]:
    """A rank's object; every rank can rebuild anyone's. Sizes differ a lot by rank."""
    gen = torch.Generator().manual_seed(rank * 7919 + len(salt))
    return {
        "rank": rank,
        "salt": salt,
        "text": f"rank {rank} says hi " * (rank * 50 + 1),
        "numbers": list(range(rank * 1000)),
        "tensor": torch.randn(3 + rank, generator=gen),
        # About 1 MB from the last rank: far past the size sent in one message.
        "blob": bytes(range(256)) * (4096 * rank),
        "nested": ((rank, None), {rank: [rank] * rank}),
    }


def _assert_same_object(actual: Any, expected: dict[str, Any], what: str) -> None:
    assert isinstance(actual, dict), f"{what}: got {type(actual).__name__}"
    assert actual.keys() == expected.keys(), what
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(actual[key], value, rtol=0, atol=0)
        else:
            assert actual[key] == value, f"{what}: field {key!r} differs"


def _all_gather_object(ctx: RankContext, ref: dist.ProcessGroup) -> None:
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, _object_of(ctx.rank, "gather"))
    gloo: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gloo, _object_of(ctx.rank, "gather"), group=ref)
    for src in range(ctx.world_size):
        _assert_same_object(gathered[src], _object_of(src, "gather"), f"slot {src}")
        _assert_same_object(gathered[src], gloo[src], f"slot {src} vs gloo")


def _broadcast_object_list(ctx: RankContext, root: int) -> None:
    def mine() -> list[Any]:
        if ctx.rank == root:
            return [_object_of(root, f"b{i}") for i in range(3)]
        return [None, "placeholder", 42]

    objects = mine()
    dist.broadcast_object_list(objects, src=root)
    for i, obj in enumerate(objects):
        _assert_same_object(obj, _object_of(root, f"b{i}"), f"object {i} from {root}")


def _rank_main(ctx: RankContext) -> dict[str, str | None]:
    ref = init_groups(ctx)
    cases: dict[str, Check] = {
        "all_gather_object": functools.partial(_all_gather_object, ctx, ref)
    }
    for root in range(ctx.world_size):
        cases[f"broadcast_object_list/root{root}"] = functools.partial(
            _broadcast_object_list, ctx, root
        )
    return run_cases(cases)


def _report(world: int) -> CaseReport:
    return spawn_cases(_rank_main, world)


WORLD = pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"w{w}")


@WORLD
def test_all_gather_object(world: int) -> None:
    _report(world).assert_passed("all_gather_object")


@WORLD
def test_broadcast_object_list_from_every_root(world: int) -> None:
    _report(world).assert_passed("broadcast_object_list/")
