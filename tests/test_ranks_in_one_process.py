"""Several ranks of one group in one process, each on a thread of its own, behind the
process's one server: torchft's integration tests run every replica group this way."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from dist_harness import RankContext, run_ranks

WORLD = 3


def _ranks_on_threads(ctx: RankContext) -> list[list[float]]:
    import torch_grpc_pg
    from torch_grpc_pg.options import Options

    results: list[list[float]] = [[] for _ in range(WORLD)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            store = dist.PrefixStore("threads", ctx.store())
            backend = torch_grpc_pg._new_backend(
                store, rank, WORLD, timedelta(seconds=60), "threads", Options()
            )
            for size in (4, 1 << 20):  # one round trip, and the ring
                x = torch.full((size,), float(rank + 1))
                backend.allreduce([x]).wait()
                results[rank].append(x[-1].item())
            backend.shutdown()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def test_every_rank_of_a_group_on_threads_of_one_process() -> None:
    (result,) = run_ranks(_ranks_on_threads, 1, timeout_s=120)
    total = float(sum(range(1, WORLD + 1)))
    assert result.value == [[total, total]] * WORLD
