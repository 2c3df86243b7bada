"""The "grpc" backend for torch.distributed.

Importing this package registers the backend::

    import torch_grpc_pg
    torch.distributed.init_process_group("grpc")
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torch_grpc_pg import _C
from torch_grpc_pg.options import Options

__all__ = ["BACKEND_NAME", "Options", "ProcessGroupGrpc"]
__version__ = "0.1.0"

BACKEND_NAME = "grpc"
ProcessGroupGrpc = _C.ProcessGroupGrpc


def _create_backend(dist_options: Any, backend_options: Any) -> _C.ProcessGroupGrpc:
    """Called by torch.distributed for every new process group that uses this backend."""
    if backend_options is None:
        options = Options()
    elif isinstance(backend_options, Options):
        options = backend_options
    else:
        raise TypeError(
            f"grpc backend: pg_options must be a torch_grpc_pg.Options, got {type(backend_options).__name__}"
        )
    return _C.ProcessGroupGrpc(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout,
        str(dist_options.group_id),
        **options.as_kwargs(),
    )


def _register() -> None:
    devices = (
        ["cpu", "cuda"]
        if torch.cuda.is_available() or torch.backends.cuda.is_built()
        else ["cpu"]
    )
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=devices
        )


_register()
