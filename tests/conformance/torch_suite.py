"""PyTorch's own distributed suite (``DistributedTest._DistTestBase``) for one backend.

This module is what PyTorch's test/distributed/test_distributed_spawn.py is
for gloo: pytest collects ``TestDistBackendWithSpawn<BACKEND>`` from it, and
every test starts WORLD_SIZE ranks that run it from this module. The
environment chooses the configuration, read by torch when it imports the
suite: BACKEND (gloo or grpc), WORLD_SIZE, TEMP_DIR (holding ``barrier/``),
and optionally INIT_METHOD. ``run.py`` beside it runs every configuration and
compares grpc with gloo; run this module directly only to look at one.

For grpc, two things are done before torch's suite is imported, because its
skip decorators read them at import:

* grpc is declared where the suite lets a backend declare a feature
  (``DistTestCases.backend_feature``), as gloo is declared there: a plugin
  backend, DDP, subgroups, and CUDA tensors (staged through host memory; the
  suite's CUDA tests still skip on a machine without enough GPUs, as gloo's do).
* the tests that the suite skips only because the backend is not named gloo
  (or gloo, nccl, mpi) run, where grpc does what the test needs: ``UNGATED``
  lists each with the reason (gates.py). A few of them pick their CPU code
  path by the backend's name; their body sees the name gloo while its
  collectives run over grpc (gates.BODY_READS_GLOO). ``run.py`` fails where
  grpc runs one of them and gloo does not pass it, so the list cannot run a
  test that gloo itself does not.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import DistTestCases

from gates import BODY_READS_GLOO, GRPC_FEATURES, UNGATED, Ungated

BACKEND = os.environ["BACKEND"]
GRPC = "grpc"

if BACKEND == GRPC:
    import torch_grpc_pg  # noqa: F401  (registers the backend in every rank)

    for feature in GRPC_FEATURES:
        DistTestCases.backend_feature[feature].add(GRPC)

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# How ranks start. PyTorch spawns a fresh interpreter per rank and test,
# which imports torch again: 5 to 18 s a test on 2 cores, most of the run.
# A fork server that has imported this module once forks each rank instead
# (gRPC is not initialised until a rank creates its group, so forking before
# is safe). TORCH_SUITE_START_METHOD=spawn runs the ranks as PyTorch does.
START_METHOD = os.environ.get("TORCH_SUITE_START_METHOD", "forkserver")


def _ungate(base: type, tests: dict[str, Ungated]) -> None:
    """Clears the suite's name-based skip of each test, after checking that it is that skip."""
    for name, (gate, _why) in tests.items():
        method = getattr(base, name)
        if not getattr(method, "__unittest_skip__", False):
            raise RuntimeError(f"{name}: expected torch's suite to skip it ({gate!r})")
        reason = method.__unittest_skip_why__
        if reason != gate:
            raise RuntimeError(
                f"{name}: torch's suite skips it for {reason!r}, not {gate!r}; "
                "check the test before running it"
            )
        method.__unittest_skip__ = False


if BACKEND == GRPC:
    _ungate(DistributedTest._DistTestBase, UNGATED)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _spawn_processes(self) -> None:
        if START_METHOD == "spawn":
            super()._spawn_processes()
            return
        context = torch.multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])

        def process(**options: Any) -> Any:
            # setUp gives every test a TEMP_DIR and INIT_METHOD of its own in
            # this process's environment; the fork server's is its first one's.
            options["kwargs"] = {
                **options.get("kwargs", {}),
                "environ": dict(os.environ),
            }
            return context.Process(**options)

        self._start_processes(process)

    def run_test(self, test_name: str, parent_pipe: Any) -> None:
        if BACKEND != GRPC or test_name not in BODY_READS_GLOO:
            super().run_test(test_name, parent_pipe)
            return
        # The body's collectives must still run over grpc.
        if dist.get_backend() != GRPC:
            raise RuntimeError(
                f"{test_name}: the default group is {dist.get_backend()}"
            )
        distributed_test.BACKEND = "gloo"
        try:
            super().run_test(test_name, parent_pipe)
        finally:
            distributed_test.BACKEND = BACKEND

    @classmethod
    def _run(
        cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any
    ) -> None:
        environ = kwargs.pop("environ", None)
        if environ is not None:
            os.environ.clear()
            os.environ.update(environ)
            # Read by the suite at import, which a spawned rank does after setUp.
            distributed_test.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
        super()._run(rank, test_name, file_name, pipe, **kwargs)


# As test_distributed_spawn.py names it; the ranks find the class by this name.
TestDistBackendWithSpawn.__name__ = f"TestDistBackendWithSpawn{BACKEND.upper()}"
TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn
