"""Back-to-back calls timed one by one, the same way in torch ranks and in MPI ranks.

Free of torch on purpose: the Open MPI worker (_mpi_allreduce_rank.py) runs it on numpy
buffers, and every anchor must be timed by the same loop as grpc and gloo.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CallBudget:
    """How many timed calls a case gets: as many as fill `seconds`, within the bounds.

    The defaults give about 2000 calls of a 4 KiB allreduce, a few hundred of 1 MiB
    and a handful of 64 MiB on a 2-core machine.
    """

    seconds: float = 0.5
    min_calls: int = 5
    max_calls: int = 2000
    warmup: int = 5

    def calls_for(self, seconds_per_call: float) -> int:
        wanted = int(self.seconds / max(seconds_per_call, 1e-7))
        return max(self.min_calls, min(self.max_calls, wanted))


def time_calls(
    run: Callable[[], object],
    barrier: Callable[[], object],
    agree_max: Callable[[float], float],
    budget: CallBudget,
) -> dict[str, float]:
    """Warm up (at least 3 calls), then time back-to-back calls; the slowest rank's
    median and mean.

    Every rank must make the same number of calls, so the count comes from the slowest
    rank's view of one call (agree_max: the maximum of a value over the ranks).
    """
    warmup = []
    for _ in range(max(3, budget.warmup)):
        start = time.perf_counter()
        run()
        warmup.append(time.perf_counter() - start)
    # The fastest warm-up call, what a warm call costs: one that the scheduler
    # preempted, or one of a backend's slow first calls, would cut the count to a
    # handful. max_calls bounds what a too-fast estimate costs.
    calls = budget.calls_for(agree_max(min(warmup)))
    barrier()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {
        "seconds": agree_max(statistics.median(times)),
        "mean_seconds": agree_max(statistics.fmean(times)),
        "calls": calls,
    }
