"""pytest plugin: runs torchft's own integration tests with the process group that
TORCHFT_SUITE_BACKEND names ("gloo" or "grpc") where they build torchft's ProcessGroupGloo.

    TORCHFT_SUITE_BACKEND=grpc TORCHFT_SUITE_RESULTS=out.json \\
        python -m pytest -p swap <site-packages>/torchft/manager_integ_test.py

torchft's tests name ProcessGroupGloo as a global of the modules below; it is replaced
there by a subclass of the chosen group that counts its instances and configure() calls,
so that a run whose tests never built the chosen group cannot pass for one that did.
Each test's outcome, its message and those counts are written to TORCHFT_SUITE_RESULTS
as JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

# Every module of torchft's integration tests that builds the gloo group by that name.
PATCHED_MODULES = (
    "torchft.manager_integ_test",
    "torchft.local_sgd_integ_test",
    "torchft._test.diloco_trainer",
)

_lock = threading.Lock()
_instances = 0
_configures = 0
_names: set[str] = set()
_results: dict[str, dict[str, Any]] = {}


def _counting(base: type) -> type:
    class Counting(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            global _instances
            with _lock:
                _instances += 1
            super().__init__(*args, **kwargs)

        def configure(self, *args: Any, **kwargs: Any) -> None:
            global _configures
            with _lock:
                _configures += 1
                _names.add(self.getBackendName())
            super().configure(*args, **kwargs)

    Counting.__name__ = Counting.__qualname__ = f"Counting{base.__name__}"
    return Counting


def _chosen_group() -> type:
    backend = os.environ.get("TORCHFT_SUITE_BACKEND", "")
    if backend == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo
    if backend == "grpc":
        from torch_grpc_pg.torchft import ProcessGroupGrpc

        return ProcessGroupGrpc
    raise pytest.UsageError(f"TORCHFT_SUITE_BACKEND must be gloo or grpc: {backend!r}")


def pytest_configure(config: pytest.Config) -> None:
    group = _counting(_chosen_group())
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        assert hasattr(module, "ProcessGroupGloo"), f"{name} no longer names it"
        module.ProcessGroupGloo = group  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    global _instances, _configures
    with _lock:
        _instances = _configures = 0
        _names.clear()
    yield
    with _lock:
        item.user_properties.append(("file", str(item.path)))
        item.user_properties.append(("instances", _instances))
        item.user_properties.append(("configures", _configures))
        item.user_properties.append(("backends", sorted(_names)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # One entry per test: the call phase, or setup when it failed or skipped there.
    if report.when != "call" and not (report.failed or report.skipped):
        return
    if report.skipped:
        result = "skipped"
        message = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
    else:
        result = "passed" if report.passed else "failed"
        message = "" if report.passed else _last_error(report.longreprtext)
    props = dict(report.user_properties)
    _results[report.nodeid.split("::", 1)[-1]] = {
        "result": result,
        "message": message,
        "seconds": round(report.duration, 3),
        "file": props.get("file", ""),
        "instances": props.get("instances", 0),
        "configures": props.get("configures", 0),
        "backends": props.get("backends", []),
    }


def _last_error(text: str) -> str:
    raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return raised[-1] if raised else text.strip().splitlines()[-1] if text else ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TORCHFT_SUITE_RESULTS")
    if path:
        Path(path).write_text(json.dumps(_results, indent=1, sort_keys=True))
