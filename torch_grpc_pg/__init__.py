"""The "grpc" backend for torch.distributed.

Importing this package registers the backend::

    import torch_grpc_pg
    torch.distributed.init_process_group("grpc")
"""

from __future__ import annotations

import copy
import inspect
import socket
from typing import Any

import torch
import torch.distributed as dist

from torch_grpc_pg import _C
from torch_grpc_pg.options import Options

__all__ = ["BACKEND_NAME", "Options", "ProcessGroupGrpc"]
__version__ = "0.1.0"

BACKEND_NAME = "grpc"
ProcessGroupGrpc = _C.ProcessGroupGrpc


def _store_host(store: Any) -> str | None:
    """The host of the TCPStore behind ``store`` (through any PrefixStores), if it is one."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, dist.TCPStore) else None


def _address_toward(host: str) -> str | None:
    """This host's address on the interface that routes to ``host``; no packet is sent."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[
            0
        ]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _default_addresses(store: Any) -> tuple[str, str]:
    """Where to listen and what to advertise when neither is set: the interface that
    reaches the store's host, since peers reach that host too. Loopback when the store is
    on loopback, so that a single-host job is not exposed to the network."""
    host = _store_host(store)
    local = _address_toward(host) if host else None
    if local is None:
        return "0.0.0.0", ""  # no TCP store: every interface, and this host's name
    return local, local


def _grpc_devices() -> list[str] | None:
    """The devices of the group being created, if it runs grpc alone on them all
    ("grpc" or "cpu:grpc", not "cpu:grpc,cuda:nccl").

    torch adopts a ProcessGroup that a creator returns and then registers no
    other backend on it, so only such a group may get one. torch passes the
    creator no backend map; it is read from torch's frame that calls the
    creator. Where that fails, the group keeps torch's ProcessGroup, which
    works the same and only names itself "custom".
    """
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame and frame.f_back else None
    config = caller.f_locals.get("backend_config") if caller else None
    if not isinstance(config, dist.distributed_c10d.BackendConfig):
        return None
    devices = config.get_device_backend_map()
    if set(devices.values()) != {BACKEND_NAME}:
        return None
    return list(devices)


def _new_backend(
    store: Any,
    rank: int,
    size: int,
    timeout: Any,
    group_name: str,
    options: Options,
) -> _C.ProcessGroupGrpc:
    """A grpc backend for one group on this rank; also what torch_grpc_pg.torchft builds
    each quorum, outside torch.distributed's registry."""
    kwargs = options.as_kwargs(_C.running_server_settings())
    if not kwargs["bind_host"] or not kwargs["advertise_host"]:
        bind_host, advertise_host = _default_addresses(store)
        kwargs["bind_host"] = kwargs["bind_host"] or bind_host
        kwargs["advertise_host"] = kwargs["advertise_host"] or advertise_host
    backend = _C.ProcessGroupGrpc(store, rank, size, timeout, group_name, **kwargs)
    _options_of_group[backend.group_key] = Options(**kwargs)
    return backend


def _create_backend(
    dist_options: Any, backend_options: Any
) -> _C.ProcessGroupGrpc | _C.GrpcProcessGroup:
    """Called by torch.distributed for every new process group that uses this backend."""
    if backend_options is None:
        options = Options()
    elif isinstance(backend_options, Options):
        options = backend_options
    else:
        raise TypeError(
            f"grpc backend: pg_options must be a torch_grpc_pg.Options, got {type(backend_options).__name__}"
        )
    backend = _new_backend(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout,
        str(dist_options.group_id),
        options,
    )
    devices = _grpc_devices()
    if devices is None:
        return backend
    return _C.GrpcProcessGroup(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        backend,
        devices,
    )


# What each group was created with, by group key: ``backend.options``, which
# torch copies into the groups that split_group() makes from it.
_options_of_group: dict[str, Options] = {}


def _backend_options(backend: _C.ProcessGroupGrpc) -> Options:
    return copy.deepcopy(_options_of_group[backend.group_key])


def _devices() -> list[str]:
    return (
        ["cpu", "cuda"]
        if torch.cuda.is_available() or torch.backends.cuda.is_built()
        else ["cpu"]
    )


def _register() -> None:
    _C.ProcessGroupGrpc.options = property(_backend_options)
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=_devices()
        )


_register()
