"""DeepSpeed's shared-memory allreduce on CPU as an anchor, set up inside a spawned rank.

What is timed is `deepspeed.comm.inference_all_reduce(tensor)`, the call DeepSpeed's
tensor-parallel layers make (deepspeed/module_inject/layers.py). On CPU it goes to
TorchBackend.inference_all_reduce (deepspeed/comm/torch.py), which calls the C++ op
`torch.ops.deepspeed.inference_all_reduce_` (csrc/cpu/comm/shm_interface.cpp, built by
ShareMemCommBuilder with g++ at first use) when that op is loaded and the CPU has AVX2
for float32; otherwise it falls back to torch.distributed.all_reduce on the default
group. The op reduces through /dev/shm segments that every rank maps (csrc/cpu/comm/
shm.cpp: one copy in, each rank reduces straight from the others' segments, ranks
wait on each other by spinning on flags), but only if `initialize` found LOCAL_SIZE
equal to the world size; the segments are named after MASTER_ADDR and MASTER_PORT.
shm_allreduce() sets those, then checks that each condition of the shared-memory path
holds and that this rank's segment exists, so that a fallback can never be timed
under DeepSpeed's name.

DeepSpeed never unlinks its segments (about 66 MiB a rank), so the parent removes them
after each world with remove_segments().
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from _spawn import RankContext

NAME = "deepspeed"
TIMED_CALL = (
    "deepspeed.comm.inference_all_reduce(t) -> "
    "torch.ops.deepspeed.inference_all_reduce_ (shared-memory op)"
)
SEGMENT_ADDR = "127.0.0.1"
SHM_DIR = Path("/dev/shm")


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (make bench-anchors installs it)"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler to build DeepSpeed's shm op at first use"
    if not SHM_DIR.is_dir():
        return (
            f"{SHM_DIR} is missing: DeepSpeed's shm allreduce maps its segments there"
        )
    return None


def version() -> str | None:
    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None


def _segment_prefix(tag: str) -> str:
    # shm.cpp: "%s_%d_%s_%s" of the buffer name, uid, MASTER_ADDR, MASTER_PORT; then _rank.
    return f"deepspeed_allreduce_buffer_{os.getuid()}_{SEGMENT_ADDR}_{tag}_"


def remove_segments(tag: str) -> None:
    for path in SHM_DIR.glob(_segment_prefix(tag) + "*"):
        path.unlink(missing_ok=True)


def shm_allreduce(ctx: RankContext, tag: str) -> Callable[[torch.Tensor], object]:
    """DeepSpeed's in-place allreduce on this rank, after checking it takes the shm path.

    Call on every rank of a world whose default group is up (gloo: DeepSpeed's own
    fallback and barriers use it). `tag` must be the same on every rank of the world
    and new for each world: it names the shared-memory segments.
    """
    os.environ["LOCAL_SIZE"] = str(ctx.world)
    os.environ["MASTER_ADDR"] = SEGMENT_ADDR
    os.environ["MASTER_PORT"] = tag
    # Without it DeepSpeed may pick another accelerator if one looks present.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.comm as ds_comm

    # Each rank prints a line when the op is built or loaded; kept for the error below.
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        ds_comm.init_distributed(
            dist_backend="gloo", auto_mpi_discovery=False, verbose=False
        )
    backend = ds_comm.comm.cdb
    problems = []
    if getattr(backend, "shm_comm_op", None) is None:
        problems.append("the shm op did not build or load")
    if not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        problems.append("torch.ops.deepspeed.inference_all_reduce_ is not registered")
    if getattr(backend, "shm_vector_kernel_level", 0) < 1:
        problems.append("the CPU lacks AVX2, so float32 falls back to all_reduce")
    segment = SHM_DIR / f"{_segment_prefix(tag)}{ctx.rank}"
    if not segment.exists():
        problems.append(f"{segment} was not created (LOCAL_SIZE != world size?)")
    if problems:
        raise RuntimeError(
            "DeepSpeed would not take its shm path: "
            + "; ".join(problems)
            + f"\nDeepSpeed said: {said.getvalue().strip()}"
        )
    return ds_comm.inference_all_reduce
