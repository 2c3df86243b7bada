"""torch.profiler sees each collective as it sees gloo's: one event per call, named after
the backend and the op, with the call's input shapes.

The oracle is gloo on the same calls in the same ranks: every event named ``gloo:<op>``
under gloo must appear as ``grpc:<op>`` under grpc, as many times and with the same
recorded shapes. Profilers and traces key on these names (torch's own suite checks
``<backend>:<op>`` for the backends it profiles). The backend records them only while a
profiler listens, so each call is first issued with no profiler running: it must leave no
trace in the profile that starts afterwards, which then holds exactly one event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from dist_harness import RankContext, backend_under_test, init_groups, run_ranks

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc",
    reason="compares the grpc backend's events with gloo's",
)

WORLD = 3
N = 1024


# Where gloo names a call otherwise, and why grpc keeps its own name.
GLOO_NAMES = {
    # gloo's title for its _allgather_base is its all_gather's.
    "all_gather_into_tensor": "all_gather",
    # gloo runs reduce_scatter_tensor as an all_reduce of the whole input; grpc
    # reduce-scatters, and says so.
    "reduce_scatter": "all_reduce",
}


def _calls(group: Any, rank: int) -> dict[str, Callable[[], None]]:
    """The public calls a training or inference job makes, blocking and async."""
    t = torch.full((N,), float(rank + 1))
    gathered = [torch.empty(N) for _ in range(WORLD)]
    peer, source = (rank + 1) % WORLD, (rank - 1) % WORLD

    def point_to_point() -> None:
        ops = [
            dist.P2POp(dist.isend, t, peer, group),
            dist.P2POp(dist.irecv, torch.empty(N), source, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return {
        "all_reduce": lambda: dist.all_reduce(t, group=group),
        "all_reduce async": lambda: dist.all_reduce(
            t, group=group, async_op=True
        ).wait(),
        "broadcast": lambda: dist.broadcast(t, 0, group=group),
        "reduce": lambda: dist.reduce(t, 0, group=group),
        "all_gather": lambda: dist.all_gather(gathered, t, group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(WORLD * N), t, group=group
        ),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(N), torch.ones(WORLD * N), group=group
        ),
        "gather": lambda: dist.gather(
            t, gathered if rank == 0 else None, 0, group=group
        ),
        "scatter": lambda: dist.scatter(
            t, gathered if rank == 0 else None, 0, group=group
        ),
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.empty(WORLD * N), torch.ones(WORLD * N), group=group
        ),
        "send and recv": point_to_point,
        "barrier": lambda: dist.barrier(group=group),
    }


def _backend_events(prof: Any, backend: str) -> list[tuple[str, str]]:
    """(op, input shapes) of each event the backend recorded, with the backend's prefix cut."""
    prefix = f"{backend}:"
    return sorted(
        (e.name[len(prefix) :], str(e.input_shapes))
        for e in prof.events()
        if e.name.startswith(prefix)
    )


def _events_per_call(ctx: RankContext) -> dict[str, dict[str, Any]]:
    """Per backend and call: the events of a profile that starts after one unprofiled call
    and holds one profiled call."""
    reference = init_groups(ctx)
    out: dict[str, dict[str, Any]] = {}
    for backend, group in (("grpc", None), ("gloo", reference)):
        out[backend] = {}
        for name, call in _calls(group, ctx.rank).items():
            call()  # nothing listens: nothing may be recorded
            dist.barrier(group=group)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                call()
            out[backend][name] = _backend_events(prof, backend)
    return out


def test_each_call_is_one_event_named_and_shaped_as_gloo_records_it() -> None:
    for result in run_ranks(_events_per_call, WORLD):
        for call, gloo in result.value["gloo"].items():
            grpc = result.value["grpc"][call]
            expected = [(GLOO_NAMES.get(op, op), shapes) for op, shapes in grpc]
            assert gloo, (
                f"rank {result.rank}, {call}: gloo recorded nothing; the oracle is broken"
            )
            assert sorted(expected) == gloo, (
                f"rank {result.rank}, {call}: grpc recorded {grpc}, gloo {gloo}"
            )
