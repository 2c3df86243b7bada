"""Timing, memory and memory-copy measurements used inside the ranks."""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil
import torch

if TYPE_CHECKING:
    from _spawn import RankContext

MiB = 2**20

# A timed sample runs back-to-back ops for at least this long, so that the skew with
# which ranks leave the barrier before it is amortised even for 4-byte messages.
SAMPLE_TARGET_S = 0.005
MAX_OPS_PER_SAMPLE = 500
MIN_SAMPLES = 5
MAX_SAMPLES = 200

Op = Callable[[], object]


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def warm_up(ctx: RankContext, op: Op, sync: Callable[[], None], calls: int) -> float:
    """Run op `calls` times; seconds per call, the slowest rank's (the same on all)."""
    times: list[float] = []
    for _ in range(max(1, calls)):
        ctx.barrier()
        start = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - start)
    # The first call pays for connection set-up and lazy allocation.
    return ctx.max_across([statistics.median(times[1:] or times)])[0]


def ops_per_sample(estimate_s: float) -> int:
    if estimate_s >= SAMPLE_TARGET_S:
        return 1
    return min(MAX_OPS_PER_SAMPLE, math.ceil(SAMPLE_TARGET_S / max(estimate_s, 1e-7)))


def sample_count(longest_sample_s: float, min_time_s: float) -> int:
    wanted = math.ceil(min_time_s / max(longest_sample_s, 1e-7))
    return min(MAX_SAMPLES, max(MIN_SAMPLES, wanted))


def interleaved_samples(
    ctx: RankContext,
    ops: list[tuple[Op, int]],
    sync: Callable[[], None],
    count: int,
) -> list[list[float]]:
    """Per op: seconds per call of each of `count` samples, the slowest rank's view.

    The ops (one per backend) take turns sample by sample, in alternating order, so
    that a burst of other work on the machine lands on all of them alike. Every rank
    follows the same plan, so no rank waits in a collective that another never issues.
    """
    samples: list[list[float]] = [[] for _ in ops]
    for i in range(count):
        order = list(enumerate(ops))
        for index, (op, per_sample) in order if i % 2 == 0 else reversed(order):
            ctx.barrier()
            start = time.perf_counter()
            for _ in range(per_sample):
                op()
            sync()
            samples[index].append((time.perf_counter() - start) / per_sample)
    return [ctx.max_across(s) for s in samples]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0): the next peak is what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak RSS since reset_peak_rss(), or over the process's life where that can't reset."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def memcpy_bandwidth(
    device: torch.device, nbytes: int = 256 * MiB, iters: int = 10
) -> float:
    """Median bytes/s of a large tensor.copy_ (bytes copied once, not read + write)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    sync = device_sync(device)
    dst.copy_(src)
    sync()
    times: list[float] = []
    for _ in range(iters):
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times)
