"""Run a function on W real ranks on loopback; stream what rank 0 reports to the parent.

Ranks are started with the spawn method: a forked child inherits gRPC's threads and locks
in an unusable state. By default every rank joins one default gloo group, used only to
coordinate (barriers, agreeing on plans, gathering timings); each backend under test gets
its own `dist.new_group(backend=...)`, because a process can hold only one default group
and the backends must be interleaved within one set of processes. The user-code mode
(`user_mode.py`) instead makes the backend under test the default group, as a training
script does.
"""

from __future__ import annotations

import datetime
import os
import queue
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _backends import load_backend

from torch_grpc_pg._ports import free_port

Message = tuple[str, Any]


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    payload: Any
    timeout: datetime.timedelta
    _queue: Any

    def emit(self, kind: str, data: Any) -> None:
        """Send a message to the parent (from rank 0 only, or the parent sees copies)."""
        self._queue.put((kind, data))

    def barrier(self) -> None:
        dist.barrier()

    def max_across(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def agree(self, ok: bool) -> bool:
        """True only if every rank says ok."""
        t = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def new_group(self, backend: str) -> dist.ProcessGroup:
        load_backend(backend)
        group = dist.new_group(backend=backend, timeout=self.timeout)
        assert group is not None
        return group


RankFn = Callable[[RankContext], None]


class WorldFailed(RuntimeError):
    pass


def default_threads(world: int) -> int:
    """Each rank's share of the cores, so that W ranks do not oversubscribe the machine."""
    return max(1, (os.cpu_count() or 1) // world)


def _rank_main(
    rank: int,
    world: int,
    port: int,
    fn: RankFn,
    payload: Any,
    out: Any,
    device_type: str,
    threads: int,
    timeout_s: float,
    default_backend: str,
) -> None:
    # torch 2.13 deprecates all_gather_into_tensor (the op the targets name) in favour
    # of all_gather_single; its warning on every call would flood the output.
    warnings.filterwarnings(
        "ignore", category=FutureWarning, module="torch.distributed"
    )
    if threads > 0:
        torch.set_num_threads(threads)
    if device_type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        load_backend(default_backend)
        dist.init_process_group(
            default_backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
        fn(RankContext(rank, world, device, payload, timeout, out))
        dist.barrier()
    except BaseException:  # the parent must hear why, whatever it was; then exit 1
        out.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    out.put(("exit", rank))


def run_world(
    fn: RankFn,
    world: int,
    payload: Any,
    on_message: Callable[[str, Any], None],
    device: str = "cpu",
    threads: int | None = None,
    timeout_s: float = 300.0,
    default_backend: str = "gloo",
) -> None:
    """Run fn on `world` spawned ranks, on_message for each message; WorldFailed on failure.

    threads: torch intra-op threads per rank; None: the rank's share of the cores; 0:
    torch's own default. default_backend: the ranks' default group.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    threads = default_threads(world) if threads is None else threads
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                rank,
                world,
                port,
                fn,
                payload,
                out,
                device,
                threads,
                timeout_s,
                default_backend,
            ),
            daemon=True,
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    exited = 0
    error: str | None = None
    # A hung rank is caught by the collective timeout; this is the backstop if the
    # process itself wedges.
    silent_limit = timeout_s * 2 + 120
    silent = 0.0
    try:
        while exited < world and error is None:
            try:
                kind, data = out.get(timeout=1.0)
            except queue.Empty:
                silent += 1.0
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    # Give the dead rank's error message a moment to arrive before
                    # reporting the exit code.
                    try:
                        kind, data = out.get(timeout=2.0)
                    except queue.Empty:
                        rank = procs.index(dead[0])
                        error = f"rank {rank} exited with code {dead[0].exitcode}"
                        break
                elif silent > silent_limit:
                    error = f"no progress from the ranks for {silent_limit:.0f} s"
                    break
                else:
                    continue
            silent = 0.0
            if kind == "error":
                error = str(data)
            elif kind == "exit":
                exited += 1
            else:
                on_message(kind, data)
    finally:
        for p in procs:
            p.join(timeout=10 if error is None else 1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if error is not None:
        raise WorldFailed(f"world {world}: {error}")
