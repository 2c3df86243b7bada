"""Suite-wide guards: no test may hang CI, whatever the backend does."""

from __future__ import annotations

import pytest

# Each spawn enforces its own, shorter timeout and kills its ranks; this is the
# backstop for a hang in the parent itself (pytest-timeout, when installed).
DEFAULT_TEST_TIMEOUT_S = 900


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: 64 MiB transfers or waits for a fault timeout (-m 'not slow')"
    )
    config.addinivalue_line(
        "markers", "timeout(seconds): fail the test after this long (pytest-timeout)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT_S))
