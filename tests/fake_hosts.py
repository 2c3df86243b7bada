"""Ranks on several "hosts" of one machine: a mount namespace of its own per host.

The backend tells hosts apart by host name, boot, mount and network namespace
(csrc/transport/endpoint.cc), so ranks in another mount namespace are on another host
to it: they dial each other over TCP on the shared loopback, and their links are the
ones between hosts. Unlike tests/two_hosts this needs no root (a user namespace
maps the caller to root inside it) and no network setup.

    python tests/fake_hosts.py host RANKS SCRIPT [ARGS...]

runs SCRIPT once for each rank in RANKS (comma-separated), with RANK set, and
exits non-zero when any of them does. ``run()`` starts one such host process per
host, every host but the first in a new mount namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from job_runner import run_logged

REPO_ROOT = Path(__file__).resolve().parent.parent


def _unshare_prefix() -> list[str]:
    """The command that puts what follows in a mount namespace of its own."""
    if os.geteuid() == 0:
        return ["unshare", "--mount"]
    return ["unshare", "--user", "--map-root-user", "--mount"]


def unavailable_reason() -> str | None:
    """None if this machine can make mount namespaces for the caller, else why not."""
    try:
        done = subprocess.run(
            [*_unshare_prefix(), "true"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare: {exc}"
    if done.returncode != 0:
        return f"unshare --mount failed: {done.stderr.strip()}"
    return None


def run(
    hosts: Sequence[Sequence[int]],
    script: Sequence[str],
    env: dict[str, str],
    log_dir: Path,
    timeout_s: float,
) -> None:
    """Run ``script`` on every rank, ``hosts[h]`` being the ranks of host h.

    Raises JobFailed (an AssertionError) with the end of each failed host's log when
    a rank fails or the job outlives ``timeout_s``; kills whatever is left either way.
    """
    world = sum(len(ranks) for ranks in hosts)
    full_env = {
        **os.environ,
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
        ),
        **env,
    }
    commands = [
        (
            [
                *([] if index == 0 else _unshare_prefix()),
                sys.executable,
                __file__,
                "host",
                ",".join(map(str, ranks)),
                *script,
            ],
            log_dir / f"host{index}.log",
        )
        for index, ranks in enumerate(hosts)
    ]
    run_logged(commands, full_env, REPO_ROOT, timeout_s)


def _host_main(ranks: str, script: list[str]) -> int:
    procs = [
        subprocess.Popen(
            [sys.executable, *script],
            env={**os.environ, "RANK": rank, "LOCAL_RANK": str(i)},
        )
        for i, rank in enumerate(ranks.split(","))
    ]
    codes = [p.wait() for p in procs]
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "host":
        sys.exit(__doc__)
    sys.exit(_host_main(sys.argv[2], sys.argv[3:]))
