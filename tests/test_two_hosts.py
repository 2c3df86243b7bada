"""DDP across two "hosts": torchrun --nnodes 2 --nproc-per-node 2 in two network namespaces.

The grpc job gets nothing but torchrun's flags: no address to advertise and no unix-socket
setting, so the backend itself must pick the interface that reaches the other host and
must not take the unix-socket shortcut to a rank in the other namespace. Its trained
parameters must equal gloo's, from the same training across the same namespaces, and a
float64 replay of the training in one process. Needs root and ``ip netns``; skipped
otherwise.

The same namespaces also train a float32 model with DDP and FSDP2 under grpc with
``TORCH_GRPC_PG_WIRE_DTYPE=bfloat16`` and without it (tests/wire_dtype_train.py): the loss
curves must agree, and the link must carry about half the bytes. And the DDP job runs once
more over three TCP connections to each peer (``TORCH_GRPC_PG_CONNECTIONS_PER_PEER=3``): its
parameters must equal gloo's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "two_hosts"))

import ddp_train
import launch
import wire_dtype_train

from torch_grpc_pg._ports import free_port

pytestmark = pytest.mark.timeout(600)

WORLD = 2 * launch.NPROC_PER_NODE
JOB_TIMEOUT_S = 180.0
# Float64 training; the backends and the replay differ only in summation order, ~1e-17
# here, while training moves parameters by ~1e-2.
TOL = {"rtol": 0.0, "atol": 1e-12}


@dataclass
class Job:
    ranks: list[dict[str, Any]]  # what each rank saved, by rank
    link_bytes: tuple[int, ...]  # sent out of each host over its link during the job


def run_ddp(
    hosts: Sequence[launch.Host],
    backend: str,
    out: Path,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = JOB_TIMEOUT_S,
) -> Job:
    """tests/two_hosts/ddp_train.py under ``backend`` on every host; what each rank saved
    and the bytes each host sent over its link."""
    before = [launch.link_tx_bytes(h) for h in hosts]
    script = [str(Path(ddp_train.__file__)), "--backend", backend, "--out", str(out)]
    launch.run_on_hosts(hosts, script, free_port(), timeout_s, out, extra_env)
    sent = tuple(launch.link_tx_bytes(h) - b for h, b in zip(hosts, before))
    ranks = [
        torch.load(out / f"{backend}-rank{rank}.pt", weights_only=True)
        for rank in range(launch.NPROC_PER_NODE * len(hosts))
    ]
    return Job(ranks, sent)


def ranks_per_namespace(job: Job) -> list[int]:
    """How many ranks ran in each network namespace, none in the test's own."""
    here = os.stat("/proc/self/ns/net").st_ino
    per_netns: dict[int, list[int]] = {}
    for saved in job.ranks:
        per_netns.setdefault(saved["netns"], []).append(saved["rank"])
    assert here not in per_netns
    return sorted(map(len, per_netns.values()))


def _run_wire_dtype(
    hosts: tuple[launch.Host, launch.Host], wire_dtype: str, out: Path
) -> Job:
    out = out / f"wire-{wire_dtype}"
    out.mkdir()
    before = [launch.link_tx_bytes(h) for h in hosts]
    script = [str(Path(wire_dtype_train.__file__)), str(out)]
    env = {"TORCH_GRPC_PG_WIRE_DTYPE": wire_dtype}
    launch.run_on_hosts(hosts, script, free_port(), JOB_TIMEOUT_S, out, env)
    sent = [launch.link_tx_bytes(h) - b for h, b in zip(hosts, before)]
    ranks = [
        torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)
    ]
    return Job(ranks, (sent[0], sent[1]))


def _run_several_connections(hosts: Sequence[launch.Host], out: Path) -> Job:
    """The DDP job over three TCP connections to each peer on the other host."""
    out = out / "connections"
    out.mkdir()
    return run_ddp(hosts, "grpc", out, {"TORCH_GRPC_PG_CONNECTIONS_PER_PEER": "3"})


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    reason = launch.unavailable_reason()
    if reason is not None:
        pytest.skip(f"two-host test: {reason}")
    launch.remove_stale()
    out = tmp_path_factory.mktemp("two_hosts")
    with launch.hosts_up(launch.unique_name()) as hosts:
        yield {
            "grpc": run_ddp(hosts, "grpc", out),
            "gloo": run_ddp(hosts, "gloo", out, launch.GLOO_ENV),
            "wire bfloat16": _run_wire_dtype(hosts, "bfloat16", out),
            "wire float32": _run_wire_dtype(hosts, "float32", out),
            "grpc, 3 connections": _run_several_connections(hosts, out),
        }


def _param_bytes() -> int:
    return sum(
        p.numel() * p.element_size() for p in ddp_train.initial_model(0).parameters()
    )


@pytest.mark.parametrize("backend", ["grpc", "gloo"])
def test_two_ranks_in_each_of_two_namespaces(
    jobs: dict[str, Job], backend: str
) -> None:
    assert all(saved["world"] == WORLD for saved in jobs[backend].ranks)
    assert ranks_per_namespace(jobs[backend]) == [2, 2]


def test_grpc_traffic_crossed_the_link(jobs: dict[str, Job]) -> None:
    # Each host must learn the other's gradients every step, at least their size each
    # way; ranks that reached the other namespace by a unix socket would send far less.
    least = ddp_train.STEPS * _param_bytes()
    assert min(jobs["grpc"].link_bytes) >= least, (jobs["grpc"].link_bytes, least)


def test_grpc_sends_each_gradient_across_once_per_host(jobs: dict[str, Job]) -> None:
    # With two ranks on each host, a flat ring (gloo's) sends every gradient byte
    # across the link 2 (world - 1) / world = 1.5 times each way per step; grpc's
    # allreduce in two levels (inside each host, then across) once. Both also carry
    # DDP's initial broadcast of the parameters and their own framing.
    grpc_bytes, gloo_bytes = max(jobs["grpc"].link_bytes), min(jobs["gloo"].link_bytes)
    assert grpc_bytes < 0.8 * gloo_bytes, (
        jobs["grpc"].link_bytes,
        jobs["gloo"].link_bytes,
    )
    assert grpc_bytes < 1.3 * ddp_train.STEPS * _param_bytes(), jobs["grpc"].link_bytes


def test_grpc_equals_gloo_on_every_rank(jobs: dict[str, Job]) -> None:
    for grpc_rank, gloo_rank in zip(jobs["grpc"].ranks, jobs["gloo"].ranks):
        for name, value in gloo_rank["params"].items():
            torch.testing.assert_close(grpc_rank["params"][name], value, **TOL)


def test_grpc_over_several_connections_equals_gloo_on_every_rank(
    jobs: dict[str, Job],
) -> None:
    # connections_per_peer=3 spreads each peer's frames over three connections
    # (tests/test_connections_per_peer.py); across hosts the training must not change.
    several = jobs["grpc, 3 connections"]
    assert min(several.link_bytes) >= ddp_train.STEPS * _param_bytes(), (
        several.link_bytes
    )
    for grpc_rank, gloo_rank in zip(several.ranks, jobs["gloo"].ranks):
        for name, value in gloo_rank["params"].items():
            torch.testing.assert_close(grpc_rank["params"][name], value, **TOL)


@pytest.mark.parametrize("backend", ["grpc", "gloo"])
def test_every_rank_equals_local_replay(jobs: dict[str, Job], backend: str) -> None:
    replay = ddp_train.local_replay(WORLD)
    start = ddp_train.initial_model(0).state_dict()
    # Otherwise matching the replay would prove little.
    assert any(not torch.allclose(replay[k], start[k], **TOL) for k in replay)
    for saved in jobs[backend].ranks:
        for name, value in replay.items():
            torch.testing.assert_close(saved["params"][name], value, **TOL)


# As tests/test_wire_dtype.py's LOSS_RTOL: measured there at most 0.12%.
WIRE_LOSS_RTOL = 0.01


@pytest.mark.parametrize("stack", ["ddp", "fsdp2"])
def test_bfloat16_on_the_wire_trains_like_float32(
    jobs: dict[str, Job], stack: str
) -> None:
    def curve(job: Job) -> torch.Tensor:
        losses = [saved[f"{stack}_losses"] for saved in job.ranks]
        return torch.tensor(losses, dtype=torch.float64).mean(0)

    narrowed, plain = curve(jobs["wire bfloat16"]), curve(jobs["wire float32"])
    assert plain[-1] < 0.5 * plain[0], plain
    gap = float(((narrowed - plain).abs() / plain).max())
    assert gap <= WIRE_LOSS_RTOL, (stack, gap, narrowed.tolist(), plain.tolist())
    first = jobs["wire bfloat16"].ranks[0][f"{stack}_params"]
    for rank, saved in enumerate(jobs["wire bfloat16"].ranks[1:], start=1):
        for name, value in first.items():
            assert torch.equal(saved[f"{stack}_params"][name], value), (name, rank)


def test_bfloat16_on_the_wire_halves_the_bytes_on_the_link(
    jobs: dict[str, Job],
) -> None:
    # Gradients and parameters are float32: all of DDP's and FSDP2's traffic narrows,
    # leaving headers, the store and TCP's acknowledgements. Measured: 20.4 MB against
    # 40.6 MB each way, 0.50x.
    narrowed = max(jobs["wire bfloat16"].link_bytes)
    plain = max(jobs["wire float32"].link_bytes)
    assert narrowed < 0.6 * plain, (jobs["wire bfloat16"].link_bytes, plain)
