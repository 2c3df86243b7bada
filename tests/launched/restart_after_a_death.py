"""A job that torchrun restarts: in the first attempt one rank dies.

    DIES=after_allreduce torchrun --standalone --nproc-per-node 3 --max-restarts 1 \
        restart_after_a_death.py

``DIES`` says when rank 1 of the first attempt exits: ``after_allreduce`` (its peers'
next collective fails) or ``before_init`` (it never creates its group, as a rank whose
setup code raised; torchrun stops its peers while they wait for it). Each rank writes what
it saw to ``$OUTCOME_DIR/attempt<A>-rank<R>.txt``: the exact sum of its allreduce, then
"done" or the error that ended it. ``BACKEND=gloo`` runs it under gloo. Run by
tests/test_torchrun.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

import torch_grpc_pg  # noqa: F401  (registers "grpc")

DYING_RANK = 1


def main() -> None:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dies = os.environ["DIES"] if attempt == 0 else ""
    if dies == "before_init" and int(os.environ["RANK"]) == DYING_RANK:
        os._exit(3)
    dist.init_process_group(os.environ.get("BACKEND", "grpc"))
    rank = dist.get_rank()
    outcome = Path(os.environ["OUTCOME_DIR"]) / f"attempt{attempt}-rank{rank}.txt"
    # Small integers: the sum is exact in any order, so the test compares it exactly.
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    lines = [f"sum {x.unique().tolist()}"]
    outcome.write_text("\n".join(lines) + "\n")
    if dies == "after_allreduce" and rank == DYING_RANK:
        os._exit(3)  # as a rank that runs out of memory: no goodbye to its peers
    try:
        dist.barrier()
        lines.append("done")
    except Exception as exc:  # the survivors of attempt 0 say what they saw
        lines.append(f"error {type(exc).__name__}: {exc}")
        outcome.write_text("\n".join(lines) + "\n")
        raise
    outcome.write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
