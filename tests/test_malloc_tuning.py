"""tune_malloc: freed transport buffers stay in the heap for reuse, unless the user said otherwise.

gRPC mallocs and frees its read buffers per message; with glibc's defaults the freed
memory went back to the kernel and was faulted in again, page by page, on the next read.
Each case runs tests/malloc/probe.py in a fresh process, because malloc's settings are
process-wide, and looks at where glibc put a 16 MiB block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_grpc_pg")

PROBE = Path(__file__).parent / "malloc" / "probe.py"
BLOCK = 16 << 20
_MALLOC_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
    "TORCH_GRPC_PG_TUNE_MALLOC",
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="tune_malloc sets glibc's malloc thresholds; other C libraries are left alone",
)


def probe(env: dict[str, str], *args: str) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in _MALLOC_VARIABLES}
    done = subprocess.run(
        [sys.executable, str(PROBE), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_by_default_a_freed_block_stays_in_the_heap() -> None:
    seen = probe({})
    assert seen["mmapped"] == 0
    # Most of it: the heap's top may have absorbed a little of it in between.
    assert seen["kept_free"] >= BLOCK - (1 << 20)


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"TORCH_GRPC_PG_TUNE_MALLOC": "0"}, ()),
        ({}, ("--option-off",)),
        ({"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, ()),
        ({"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={1 << 20}"}, ()),
        ({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)}, ()),
    ],
    ids=[
        "variable-off",
        "option-off",
        "user-mmap-threshold",
        "user-tunables",
        "user-trim-threshold",
    ],
)
def test_glibc_keeps_its_own_rules_when_off_or_configured_by_the_user(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    # glibc's default (or the user's 1 MiB threshold) maps a 16 MiB block in a fresh
    # process and unmaps it when freed.
    seen = probe(env, *args)
    assert seen["mmapped"] >= BLOCK
    assert seen["kept_free"] < BLOCK // 2
