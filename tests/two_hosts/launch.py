"""Network namespaces standing for hosts (netns.sh), and torchrun across them.

Two hosts on one veth pair, more on a bridge, or any number behind a hub that delays
every frame (a long link). Shared by tests/test_two_hosts.py, tests/test_more_hosts.py and
benchmarks/two_hosts.py. Every subprocess runs under a timeout, and whatever a job leaves
running is killed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
# tests/job_runner.py, also when a benchmark imports this file.
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))

from job_runner import run_logged  # noqa: E402

NETNS_SH = HERE / "netns.sh"
NPROC_PER_NODE = 2
NETNS_TIMEOUT_S = 60.0
PEER_FAILED_GRACE_S = 20.0

# Settings that would let a job pass without the defaults under test: the address a
# rank advertises and the unix-socket shortcut must both be found by the backend.
_SCRUBBED = (
    "TORCH_GRPC_PG_ADVERTISE_HOST",
    "TORCH_GRPC_PG_BIND_HOST",
    "TORCH_GRPC_PG_UNIX_SOCKETS",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class Host:
    netns: str
    address: str


def netns(*args: str, timeout_s: float = NETNS_TIMEOUT_S) -> str:
    """Run netns.sh with ``args``; its stdout. CalledProcessError carries its stderr."""
    done = subprocess.run(
        ["bash", str(NETNS_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return done.stdout


def unavailable_reason(count: int = 2, rtt_ms: int = 0) -> str | None:
    """None if this machine can make ``count`` hosts ``rtt_ms`` apart, else why not."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    needs = [
        *(["bridge"] if count > 2 and rtt_ms == 0 else []),
        *(["delay"] if rtt_ms > 0 else []),
    ]
    try:
        netns("check", *needs)
    except FileNotFoundError as exc:
        return f"cannot run netns.sh: {exc}"
    except subprocess.CalledProcessError as exc:
        return f"cannot create network namespaces: {exc.stderr.strip() or exc}"
    except subprocess.TimeoutExpired:
        return "netns.sh check timed out"
    return None


def unique_name(prefix: str = "tgpg") -> str:
    """A namespace-pair name no other run uses at the same time."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def remove_stale(prefix: str = "tgpg") -> list[str]:
    """Delete pairs named by unique_name() whose process is gone (killed before its
    cleanup ran); the names deleted."""
    listed = subprocess.run(
        ["ip", "netns", "list"],
        capture_output=True,
        text=True,
        timeout=NETNS_TIMEOUT_S,
        check=True,
    ).stdout
    pattern = re.compile(rf"^({re.escape(prefix)}-(\d+)-[0-9a-f]{{6}})-a\b")
    stale = [
        m.group(1)
        for m in map(pattern.match, listed.splitlines())
        if m and not psutil.pid_exists(int(m.group(2)))
    ]
    for name in stale:
        netns("down", name)
    return stale


@contextmanager
def hosts_up(name: str, count: int = 2, rtt_ms: int = 0) -> Iterator[tuple[Host, ...]]:
    """``count`` hosts named after ``name``, ``rtt_ms`` apart, deleted on exit whatever
    happened inside."""
    try:
        lines = netns("up", name, str(count), str(rtt_ms)).split()
        yield tuple(Host(ns, address) for ns, address in zip(lines[::2], lines[1::2]))
    finally:
        netns("down", name)


def set_name(hosts: Sequence[Host]) -> str:
    """The name netns.sh knows the hosts by (each namespace is NAME-letter)."""
    return hosts[0].netns[:-2]


def link_tx_bytes(host: Host) -> int:
    """Bytes sent so far out of ``host``'s end of the link."""
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            host.netns,
            "cat",
            "/sys/class/net/veth0/statistics/tx_bytes",
        ],
        capture_output=True,
        text=True,
        timeout=NETNS_TIMEOUT_S,
        check=True,
    )
    return int(done.stdout)


# gloo finds its interface through the host name, which both namespaces resolve to
# 127.0.0.1; it has to be told. The grpc backend must find it on its own.
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "veth0"}


def worker_env() -> dict[str, str]:
    """This environment with the repository importable and nothing pre-set for the backend."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    # Appended: an installed torch_grpc_pg wins over the checkout, as in the benchmarks.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
    )
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun_command(
    host: Host,
    store_host: Host,
    nnodes: int,
    port: int,
    run_id: str,
    script: Sequence[str],
) -> list[str]:
    """torchrun on ``host`` for an ``nnodes`` job whose c10d rendezvous store is on
    ``store_host``.

    ``is_host`` and ``--local-addr`` only stand in for DNS: the namespaces share the
    machine's host name, which resolves to 127.0.0.1, so torchrun could not tell which
    node hosts the store nor tell the other node where rank 0 is.
    """
    is_store = host == store_host
    return [
        "ip", "netns", "exec", host.netns,
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(NPROC_PER_NODE),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{store_host.address}:{port}",
        "--rdzv-id", run_id,
        "--rdzv-conf", f"is_host={int(is_store)},join_timeout=60",
        "--local-addr", host.address,
        "--max-restarts", "0",
        *script,
    ]  # fmt: skip


def run_on_hosts(
    hosts: Sequence[Host],
    script: Sequence[str],
    port: int,
    timeout_s: float,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> None:
    """Run ``script`` (a Python file and its arguments) under torchrun on every host.

    JobFailed, with the end of each failed node's log, if any node fails or the job
    outlives ``timeout_s``. A node whose peer failed gets a short grace, not the full
    timeout, to fail on its own.
    """
    run_id = uuid.uuid4().hex[:12]
    env = {**worker_env(), **(extra_env or {})}
    commands = [
        (
            torchrun_command(host, hosts[0], len(hosts), port, run_id, script),
            log_dir / f"torchrun-{host.netns}-{run_id}.log",
        )
        for host in hosts
    ]
    run_logged(commands, env, REPO_ROOT, timeout_s, PEER_FAILED_GRACE_S)
