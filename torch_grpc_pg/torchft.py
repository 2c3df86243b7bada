"""torchft process groups over grpc: fault-tolerant training across replica groups.

torchft's Manager calls ``configure()`` on every new quorum with a fresh store prefix, and
``abort()`` when an op fails or times out; these classes build a new grpc group each time,
as torchft's ProcessGroupGloo and ProcessGroupBabyGloo do with gloo::

    from torch_grpc_pg.torchft import ProcessGroupGrpc
    manager = torchft.Manager(pg=ProcessGroupGrpc(), ...)

torchft is an optional dependency: ``pip install torch-grpc-pg[torchft]``.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store

try:
    from torchft.process_group import ProcessGroupBaby, ProcessGroupWrapper
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_grpc_pg.torchft needs torchft: pip install 'torch-grpc-pg[torchft]' "
        "(or pip install torchft)"
    ) from exc

import torch_grpc_pg
from torch_grpc_pg import _C
from torch_grpc_pg.options import Options

__all__ = ["ProcessGroupBabyGrpc", "ProcessGroupGrpc"]

_CONNECT_TIMEOUT_VARIABLE = "TORCH_GRPC_PG_CONNECT_TIMEOUT"


def _devices() -> list[str]:
    # Device tensors are staged through host memory, so one backend serves every device.
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _group_name(quorum_id: int | None, group_rank: int | None) -> str:
    # Names the group in errors, the status tool and flight records; torchft's gloo and
    # NCCL groups are named the same way.
    if quorum_id is None:
        return "torchft"
    return f"torchft_quorum_{quorum_id}_rank_{group_rank or 0}"


def _create_group(
    store: Store,
    rank: int,
    world_size: int,
    timeout: timedelta,
    options: Options,
    group_name: str,
) -> BaseProcessGroup:
    if (
        not options.given("connect_timeout")
        and _CONNECT_TIMEOUT_VARIABLE not in os.environ
    ):
        # Setup waits for peers at most torchft's own timeout (gloo's store wait is that
        # too): a replica that died between quorum and configure fails configure() in
        # that time. A copy, so that what was given stays given (server settings).
        options = copy.copy(options)
        options.connect_timeout = timeout
    backend = torch_grpc_pg._new_backend(
        store, rank, world_size, timeout, group_name, options
    )
    return _C.GrpcProcessGroup(store, rank, world_size, backend, _devices())


def _backend_of(pg: BaseProcessGroup | None) -> Any:
    if pg is None:
        return None
    try:
        return pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None


class ProcessGroupGrpc(ProcessGroupWrapper):
    """A reconfigurable grpc process group for torchft, in this process.

    Args:
        timeout: op timeout of each group, and the most its setup waits for peers
            (unless ``options`` sets ``connect_timeout``).
        options: grpc settings (token, TLS, addresses, ...), as for ``pg_options``.
    """

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=60),
        options: Options | None = None,
    ) -> None:
        super().__init__(timeout=timeout)
        self._options = options or Options()
        # Kept past abort(): errored() reports the failure after torchft dropped the group.
        self._failure: Exception | None = None

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        self._failure = None
        return _create_group(
            store,
            rank,
            world_size,
            self._timeout,
            self._options,
            _group_name(self._quorum_id, self._group_rank),
        )

    def abort(self, errored: bool = True) -> None:
        # Record why first: abort() turns the group's state into "aborted on rank r".
        self._note_failure()
        if not errored:
            # configure() drops the last quorum's group this way. It may be healthy, with
            # a peer still taking in the last frames of an op this rank has finished: an
            # abort would fail that op there, so close it as destroy_process_group() does
            # (bounded too, and an op still running here fails at once).
            self.shutdown()
            return
        if self._failure is None and self._pg is not None:
            self._failure = RuntimeError(
                f"grpc process group aborted on rank {self._rank}"
            )
        super().abort(errored=errored)

    def shutdown(self) -> None:
        # torchft's wrapper only drops the group; close its links now, in bounded time.
        pg = self._pg
        if pg is not None:
            pg.shutdown()
        super().shutdown()

    def errored(self) -> Exception | None:
        """The first failure of the current group (a peer's death, a timeout, an abort),
        or None while it is healthy."""
        self._note_failure()
        return self._failure

    def _note_failure(self) -> None:
        if self._failure is not None:
            return
        backend = _backend_of(self._pg)
        reason = backend.failure if backend is not None else ""
        if reason:
            self._failure = RuntimeError(reason)

    def getBackendName(self) -> str:
        return "torchft-grpc"


class ProcessGroupBabyGrpc(ProcessGroupBaby):
    """grpc in a subprocess (torchft's "baby" design): a hung or crashed group is killed
    with its process, and configure() starts a fresh one. Tensors move through shared
    memory. Settings come from the TORCH_GRPC_PG_* variables, which the subprocess
    inherits."""

    @classmethod
    def _create_pg(cls, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        # torchft calls this in the spawned subprocess, which has the default op timeout.
        timeout = timedelta(seconds=60)
        return _create_group(store, rank, world_size, timeout, Options(), "torchft")

    def getBackendName(self) -> str:
        return "torchft-baby-grpc"
