"""DDP across four "hosts" on a bridge, and across two hosts 40 ms apart.

Across four hosts grpc trains twice: with its default allreduce in two levels, and with
``TORCH_GRPC_PG_TWO_LEVEL=0``, a flat ring like gloo's, which must then send what gloo
sends.

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

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "two_hosts"))

import ddp_train
import launch
from test_two_hosts import TOL, Job, ranks_per_namespace, run_ddp

from torch_grpc_pg._ports import free_port

pytestmark = pytest.mark.timeout(900)

JOB_TIMEOUT_S = 300.0
FOUR = 4
RTT_MS = 40
FLAT_RING_ENV = {"TORCH_GRPC_PG_TWO_LEVEL": "0"}

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


@dataclass
class Jobs:
    handshake_ms: float  # the fastest TCP handshake between the first and last host
    grpc: Job
    gloo: Job
    grpc_flat: Job | None = None  # with FLAT_RING_ENV


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


def _jobs(out: Path, count: int, rtt_ms: int, flat_ring: bool = False) -> Jobs:
    launch.remove_stale()
    with launch.hosts_up(launch.unique_name(), count, rtt_ms) as hosts:
        jobs = Jobs(
            handshake_ms=_handshake_ms(hosts[0], hosts[-1]),
            grpc=run_ddp(hosts, "grpc", out, timeout_s=JOB_TIMEOUT_S),
            gloo=run_ddp(hosts, "gloo", out, launch.GLOO_ENV, JOB_TIMEOUT_S),
        )
        if flat_ring:
            # Its ranks save under the same names as the first grpc job's.
            flat_out = out / "flat"
            flat_out.mkdir()
            jobs.grpc_flat = run_ddp(
                hosts, "grpc", flat_out, FLAT_RING_ENV, JOB_TIMEOUT_S
            )
        return jobs


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    if (reason := launch.unavailable_reason(FOUR)) is not None:
        pytest.skip(f"four-host test: {reason}")
    yield _jobs(tmp_path_factory.mktemp("four_hosts"), FOUR, 0, flat_ring=True)


@pytest.fixture(scope="module")
def long_link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    if (reason := launch.unavailable_reason(2, RTT_MS)) is not None:
        pytest.skip(f"long-link test: {reason}")
    yield _jobs(tmp_path_factory.mktemp("long_link"), 2, RTT_MS)


def _check_trained(jobs: Jobs, world: int) -> None:
    replay = ddp_train.local_replay(world)
    start = ddp_train.initial_model(0).state_dict()
    assert any(not torch.allclose(replay[k], start[k], **TOL) for k in replay)
    trained = [jobs.grpc, jobs.gloo] + ([jobs.grpc_flat] if jobs.grpc_flat else [])
    for job in trained:
        assert len(job.ranks) == world
        for saved in job.ranks:
            for name, value in replay.items():
                torch.testing.assert_close(saved["params"][name], value, **TOL)


def test_four_hosts_train_as_gloo_and_the_replay(four_hosts: Jobs) -> None:
    assert ranks_per_namespace(four_hosts.grpc) == [2] * FOUR
    assert all(saved["world"] == 2 * FOUR for saved in four_hosts.grpc.ranks)
    _check_trained(four_hosts, 2 * FOUR)


def test_four_hosts_send_fewer_bytes_than_a_flat_ring(four_hosts: Jobs) -> None:
    # gloo's flat ring sends each gradient byte out of each host 2 (world - 1) / world
    # = 1.75 times per step; grpc's two levels 2 (hosts - 1) / hosts = 1.5 times: 0.86x.
    grpc, gloo = four_hosts.grpc.link_bytes, four_hosts.gloo.link_bytes
    assert max(grpc) < 0.95 * min(gloo), (grpc, gloo)


def test_four_hosts_flat_ring_sends_what_gloo_sends(four_hosts: Jobs) -> None:
    # With two levels off, both backends run one ring over the eight ranks: 1.75 sends
    # of each gradient byte out of each host per step, against two levels' 1.5. Hosts
    # also send what is not gradients, unevenly: the first host serves the rendezvous
    # store, and the first hosts forward DDP's first broadcast. So the least-loaded host
    # is compared, which sends the ring's share and little else.
    assert four_hosts.grpc_flat is not None
    assert ranks_per_namespace(four_hosts.grpc_flat) == [2] * FOUR
    flat = min(four_hosts.grpc_flat.link_bytes)
    gloo = min(four_hosts.gloo.link_bytes)
    two_level = min(four_hosts.grpc.link_bytes)
    sent = f"least per host: flat {flat}, gloo {gloo}, two levels {two_level}"
    assert 0.95 * gloo < flat < 1.05 * gloo, sent
    assert flat > 1.1 * two_level, sent


def test_the_long_link_delays_each_way(long_link: Jobs) -> None:
    assert RTT_MS <= long_link.handshake_ms < 2 * RTT_MS, long_link.handshake_ms


def test_two_hosts_40ms_apart_train_as_gloo_and_the_replay(long_link: Jobs) -> None:
    assert ranks_per_namespace(long_link.grpc) == [2, 2]
    _check_trained(long_link, 4)
