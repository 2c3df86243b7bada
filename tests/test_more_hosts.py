"""DDP across four "hosts" on a bridge, and across two hosts 40 ms apart.

Like tests/test_two_hosts.py, each job is torchrun with nothing but its own flags on every
network namespace, two ranks per host (tests/two_hosts/launch.py), and trains
tests/two_hosts/ddp_train.py in float64. The oracles: gloo's parameters from the same
training on the same hosts, and a float64 replay of the training in one process.

The long link is tests/two_hosts/delay_hub.cc between the namespaces: the test first
checks with a TCP handshake's round trip that the delay is really there, so that a hub
that passed frames at once could not pass for one. Needs root and ``ip netns``; skipped
otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "two_hosts"))

import ddp_train
import launch
from test_two_hosts import TOL, Job

from torch_grpc_pg._ports import free_port

pytestmark = pytest.mark.timeout(900)

JOB_TIMEOUT_S = 300.0
FOUR = 4
RTT_MS = 40

# Times TCP handshakes from inside a namespace to ADDRESS:PORT and prints the fastest
# in ms: the SYN and SYN-ACK cross the link once each way. The first one also waits for
# ARP to find the peer, another round trip.
_HANDSHAKE = """
import socket, sys, time
address, port = sys.argv[1], int(sys.argv[2])
times = []
for _ in range(3):
    start = time.perf_counter()
    socket.create_connection((address, port), timeout=10).close()
    times.append((time.perf_counter() - start) * 1e3)
print(min(times))
"""
_LISTEN = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""


def _run_ddp(hosts: tuple[launch.Host, ...], backend: str, out: Path) -> Job:
    before = [launch.link_tx_bytes(h) for h in hosts]
    script = [str(Path(ddp_train.__file__)), "--backend", backend, "--out", str(out)]
    env = launch.GLOO_ENV if backend == "gloo" else None
    launch.run_on_hosts(hosts, script, free_port(), JOB_TIMEOUT_S, out, env)
    sent = tuple(launch.link_tx_bytes(h) - b for h, b in zip(hosts, before))
    world = launch.NPROC_PER_NODE * len(hosts)
    ranks = [
        torch.load(out / f"{backend}-rank{rank}.pt", weights_only=True)
        for rank in range(world)
    ]
    return Job(ranks, sent)


def _handshake_ms(client: launch.Host, server: launch.Host) -> float:
    port = free_port()
    exec_in = ["ip", "netns", "exec"]
    listener = subprocess.Popen(
        [
            *exec_in,
            server.netns,
            sys.executable,
            "-c",
            _LISTEN,
            server.address,
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "listening"
        done = subprocess.run(
            [
                *exec_in,
                client.netns,
                sys.executable,
                "-c",
                _HANDSHAKE,
                server.address,
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return float(done.stdout)
    finally:
        listener.kill()
        listener.wait()


def _jobs(out: Path, count: int, rtt_ms: int) -> dict[str, object]:
    launch.remove_stale()
    with launch.hosts_up(launch.unique_name(), count, rtt_ms) as hosts:
        started = time.monotonic()
        return {
            "handshake_ms": _handshake_ms(hosts[0], hosts[-1]),
            "grpc": _run_ddp(hosts, "grpc", out),
            "gloo": _run_ddp(hosts, "gloo", out),
            "seconds": time.monotonic() - started,
        }


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    if (reason := launch.unavailable_reason(FOUR)) is not None:
        pytest.skip(f"four-host test: {reason}")
    yield _jobs(tmp_path_factory.mktemp("four_hosts"), FOUR, 0)


@pytest.fixture(scope="module")
def long_link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    if (reason := launch.unavailable_reason(2, RTT_MS)) is not None:
        pytest.skip(f"long-link test: {reason}")
    yield _jobs(tmp_path_factory.mktemp("long_link"), 2, RTT_MS)


def _check_trained(jobs: dict[str, object], world: int) -> None:
    grpc, gloo = jobs["grpc"], jobs["gloo"]
    assert isinstance(grpc, Job) and isinstance(gloo, Job)
    replay = ddp_train.local_replay(world)
    start = ddp_train.initial_model(0).state_dict()
    assert any(not torch.allclose(replay[k], start[k], **TOL) for k in replay)
    for grpc_rank, gloo_rank in zip(grpc.ranks, gloo.ranks, strict=True):
        for name, value in replay.items():
            torch.testing.assert_close(grpc_rank["params"][name], value, **TOL)
            torch.testing.assert_close(gloo_rank["params"][name], value, **TOL)


def _ranks_per_namespace(job: Job) -> list[int]:
    here = os.stat("/proc/self/ns/net").st_ino
    per_netns: dict[int, list[int]] = {}
    for saved in job.ranks:
        per_netns.setdefault(saved["netns"], []).append(saved["rank"])
    assert here not in per_netns
    return sorted(map(len, per_netns.values()))


def test_four_hosts_train_as_gloo_and_the_replay(four_hosts: dict[str, object]) -> None:
    grpc = four_hosts["grpc"]
    assert isinstance(grpc, Job)
    assert _ranks_per_namespace(grpc) == [2] * FOUR
    assert all(saved["world"] == 2 * FOUR for saved in grpc.ranks)
    _check_trained(four_hosts, 2 * FOUR)


def test_four_hosts_send_fewer_bytes_than_a_flat_ring(
    four_hosts: dict[str, object],
) -> None:
    # gloo's flat ring sends each gradient byte out of each host 2 (world - 1) / world
    # = 1.75 times per step; grpc's two levels 2 (hosts - 1) / hosts = 1.5 times: 0.86x.
    grpc, gloo = four_hosts["grpc"], four_hosts["gloo"]
    assert isinstance(grpc, Job) and isinstance(gloo, Job)
    assert max(grpc.link_bytes) < 0.95 * min(gloo.link_bytes), (
        grpc.link_bytes,
        gloo.link_bytes,
    )


def test_the_long_link_delays_each_way(long_link: dict[str, object]) -> None:
    handshake = long_link["handshake_ms"]
    assert isinstance(handshake, float)
    assert RTT_MS <= handshake < 2 * RTT_MS, handshake


def test_two_hosts_40ms_apart_train_as_gloo_and_the_replay(
    long_link: dict[str, object],
) -> None:
    grpc = long_link["grpc"]
    assert isinstance(grpc, Job)
    assert _ranks_per_namespace(grpc) == [2, 2]
    _check_trained(long_link, 4)
