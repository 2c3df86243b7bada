"""One Open MPI rank of one_host.py: float32 allreduce through mpi4py, timed like the others.

Started by _anchor_mpi.py as `mpirun -n W python _mpi_allreduce_rank.py ARGS`; rank 0
prints one JSON object a line on stdout: the library's version first, then one per size.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _call_timing import CallBudget, time_calls


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma list of bytes")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--min-calls", type=int, required=True)
    parser.add_argument("--max-calls", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="MPI_IN_PLACE on one buffer instead of a send and a receive buffer",
    )
    return parser.parse_args()


def allreduce_call(comm: MPI.Comm, nbytes: int, in_place: bool):
    """The timed call, its buffer, and the buffer that holds the result."""
    send = np.zeros(nbytes // 4, dtype=np.float32)
    if in_place:
        return (lambda: comm.Allreduce(MPI.IN_PLACE, send, op=MPI.SUM)), send, send
    recv = np.zeros_like(send)
    return (lambda: comm.Allreduce(send, recv, op=MPI.SUM)), send, recv


def result_is_right(comm: MPI.Comm, run, send, result) -> bool:
    """Each rank sends rank + 1; every element must come back as the sum over ranks."""
    world = comm.Get_size()
    send.fill(comm.Get_rank() + 1)
    run()
    expected = world * (world + 1) // 2
    ok = bool(result.min() == expected and result.max() == expected)
    return bool(comm.allreduce(ok, op=MPI.LAND))


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    budget = CallBudget(args.seconds, args.min_calls, args.max_calls, args.warmup)
    if comm.Get_rank() == 0:
        header = {"library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0]}
        print(json.dumps(header), flush=True)
    for nbytes in (int(s) for s in args.sizes.split(",")):
        run, send, result = allreduce_call(comm, nbytes, args.in_place)
        if not result_is_right(comm, run, send, result):
            raise RuntimeError(f"mpi allreduce {nbytes} B: wrong result")
        # Zeros for timing, as the torch ranks do: sums never overflow or go denormal.
        send.fill(0)
        timing = time_calls(
            run,
            comm.Barrier,
            lambda value: comm.allreduce(value, op=MPI.MAX),
            budget,
        )
        if comm.Get_rank() == 0:
            print(json.dumps({"bytes": nbytes, "checked": True, **timing}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # mpirun must not wait on the other ranks forever
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
