"""Which process-group backends can run here; loading the ones that live outside torch."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def load_backend(name: str) -> None:
    """Import whatever registers `name` with torch.distributed (nothing for torch's own)."""
    if name == "grpc":
        # Imported only on request so that gloo/nccl runs work on a checkout whose
        # extension is not built. Appended, not prepended: an installed torch_grpc_pg
        # wins over the checkout.
        root = str(Path(__file__).resolve().parent.parent)
        if root not in sys.path:
            sys.path.append(root)
        importlib.import_module("torch_grpc_pg")
    elif name == "fake":
        # torch's own backend that moves no data: every call returns a finished Work.
        importlib.import_module("torch.testing._internal.distributed.fake_pg")


def unavailable_reason(name: str, device: str) -> str | None:
    """None if `name` can run collectives on `device` here, else a one-line reason."""
    if name == "grpc":
        try:
            load_backend(name)
        except Exception as exc:  # an unbuilt or broken extension fails in many ways
            return f"`import torch_grpc_pg` failed ({type(exc).__name__}: {exc})"
        # An empty torch_grpc_pg/ directory imports as a namespace package without
        # registering anything.
        if "grpc" not in dist.Backend.backend_list:
            return "torch_grpc_pg imported but did not register the 'grpc' backend"
        return None
    if name == "gloo":
        return None if dist.is_gloo_available() else "torch was built without gloo"
    if name == "fake":
        try:
            load_backend(name)
        except ImportError as exc:
            return f"torch's fake backend did not import ({exc})"
        return None
    if name == "nccl":
        if device != "cuda":
            return "nccl needs --device cuda"
        if not torch.cuda.is_available():
            return "no CUDA device"
        return None if dist.is_nccl_available() else "torch was built without nccl"
    return (
        None
        if dist.is_backend_available(name)
        else f"backend {name!r} is not available in this torch"
    )


def available_backends(
    requested: list[str], device: str
) -> tuple[list[str], list[str]]:
    """The requested backends that can run, and one note per backend that cannot."""
    if device == "cuda" and not torch.cuda.is_available():
        return [], ["--device cuda, but torch sees no CUDA device here"]
    usable: list[str] = []
    notes: list[str] = []
    for name in requested:
        reason = unavailable_reason(name, device)
        if reason is None:
            usable.append(name)
        else:
            notes.append(f"skipping backend {name}: {reason}")
    return usable, notes


def backends_for_world(
    backends: list[str], world: int, device: str
) -> tuple[list[str], list[str]]:
    """NCCL needs a GPU per rank; other backends may share one (rank % device_count)."""
    if device != "cuda" or "nccl" not in backends:
        return backends, []
    gpus = torch.cuda.device_count()
    if world <= gpus:
        return backends, []
    return [b for b in backends if b != "nccl"], [
        f"nccl skipped at world {world}: only {gpus} GPU(s) here"
    ]
