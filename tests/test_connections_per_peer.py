"""Several TCP connections per peer (``connections_per_peer``): the same results, more in flight.

With ``TORCH_GRPC_PG_CONNECTIONS_PER_PEER=K`` a group's collectives spread their frames over
K TCP connections to each peer on another host, frame n on connection n mod K
(csrc/transport/striped_transport.h). Here every link runs over TCP on one host
(``TORCH_GRPC_PG_UNIX_SOCKETS=0``), as between hosts. The oracle is gloo: the whole of
test_gloo_oracle's battery (every public call, every dtype, worlds 2 and 3) runs over
striped links with and without a token, and a large allreduce of many chunks (frames
spread over every connection, reduced in a fixed order) must equal gloo's bit for bit.
The connections themselves are counted in /proc, and ranks that disagree on K must fail
at creation, naming the setting, rather than read each other's frames out of order. Each
connection has a handshake and keys of its own: a relay that moves a frame from one
connection to another fails the group on every rank.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import test_gloo_oracle
import test_man_in_the_middle
import torch
import torch.distributed as dist

from dist_harness import (
    CaseReport,
    RankContext,
    backend_under_test,
    init_default_group,
    init_groups,
    run_ranks,
)

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="a setting of the grpc backend"
)

CONNECTIONS = 3


@pytest.fixture(autouse=True)
def tcp_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links over TCP, as between hosts (no unix sockets, so no rings and no segment)."""
    monkeypatch.setenv("TORCH_GRPC_PG_UNIX_SOCKETS", "0")
    monkeypatch.setenv("TORCH_GRPC_PG_CONNECTIONS_PER_PEER", str(CONNECTIONS))


@pytest.mark.parametrize("token", ["", "a shared secret"], ids=["plain", "token"])
@pytest.mark.parametrize("world", test_gloo_oracle.WORLDS)
def test_every_call_matches_gloo(
    world: int, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_GRPC_PG_AUTH_TOKEN", token)
    # Not spawn_cases: it caches one spawn per world, made under other settings.
    report = CaseReport.from_spawn(
        lambda: run_ranks(test_gloo_oracle._rank_main, world)
    )
    report.assert_passed("")
    assert len(report.outcomes) > 100, sorted(report.outcomes)


def _large_allreduce(ctx: RankContext) -> dict[str, Any]:
    gloo = init_groups(ctx)
    gen = torch.Generator().manual_seed(ctx.rank)
    # 24 chunks of 64 KiB per rank at world 3, odd in elements: every
    # connection carries several frames of each phase, and the last is short.
    inputs = torch.randn(3 * (1 << 18) + 7, generator=gen)
    ours, theirs = inputs.clone(), inputs.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    exact = inputs.double().clone()
    dist.all_reduce(exact, group=gloo)
    gathered = [torch.empty_like(inputs) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, inputs)
    out = {
        "max_error": (ours.double() - exact).abs().max().item(),
        "scale": exact.abs().max().item(),
        "all_gather_exact": all(
            torch.equal(block, _inputs_of(rank, inputs.numel()))
            for rank, block in enumerate(gathered)
        ),
    }
    dist.destroy_process_group()
    return out


def _inputs_of(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(rank))


def _grpc_connections(server_ports: set[int], own_port: int) -> int:
    """This process's established TCP connections between grpc servers' ports: those it
    dialled to a peer's server and those its own server accepted. Sockets in
    /proc/net/tcp{,6} whose inode one of its file descriptors holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] != "01" or fields[9] not in inodes:  # 01: established
                    continue
                local = int(fields[1].rsplit(":", 1)[1], 16)
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                if local == own_port or remote in server_ports - {own_port}:
                    count += 1
    return count


def test_large_allreduce_equals_gloo_over_every_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_GRPC_PG_CHUNK_BYTES", str(64 << 10))
    world = 3
    results = [r.value for r in run_ranks(_large_allreduce, world)]
    for rank, res in enumerate(results):
        # Ring order and float32 rounding differ from gloo's; against a
        # float64 sum the error stays at float32's few ulps of the largest sum.
        assert res["max_error"] <= 1e-5 * res["scale"], (rank, res)
        assert res["all_gather_exact"], rank


def test_each_peer_gets_that_many_connections() -> None:
    world = 3
    for connections in (1, CONNECTIONS):
        counts = [r.value for r in run_ranks(_count_connections, world, connections)]
        # To each peer a rank dials K connections for collectives and one for
        # point-to-point, and accepts as many from it.
        assert counts == [2 * (connections + 1) * (world - 1)] * world, (
            connections,
            counts,
        )


def _count_connections(ctx: RankContext, connections: int) -> int:
    os.environ["TORCH_GRPC_PG_CONNECTIONS_PER_PEER"] = str(connections)
    init_default_group(ctx)
    dist.all_reduce(torch.ones(4))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    own_port = int(backend.tcp_address.rsplit(":", 1)[1])
    ports: list[int] = [0] * ctx.world_size
    dist.all_gather_object(ports, own_port)
    count = _grpc_connections(set(ports), own_port)
    dist.barrier()
    dist.destroy_process_group()
    return count


def _disagreeing_rank(ctx: RankContext) -> str:
    if ctx.rank == 0:
        os.environ["TORCH_GRPC_PG_CONNECTIONS_PER_PEER"] = "1"
    try:
        init_default_group(ctx)
    except Exception as exc:  # the error every rank must raise
        return str(exc)
    return "created"


def test_ranks_that_disagree_fail_at_creation_naming_the_setting() -> None:
    results = [r.value for r in run_ranks(_disagreeing_rank, 2)]
    for rank, message in enumerate(results):
        for named in (
            "connections_per_peer=1",
            f"connections_per_peer={CONNECTIONS}",
            "TORCH_GRPC_PG_CONNECTIONS_PER_PEER",
        ):
            assert named in message, (rank, message)


def test_out_of_range_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch_grpc_pg

    monkeypatch.setenv("TORCH_GRPC_PG_CONNECTIONS_PER_PEER", "17")
    with pytest.raises(ValueError, match="TORCH_GRPC_PG_CONNECTIONS_PER_PEER"):
        torch_grpc_pg.Options().validate()


def test_a_relay_that_moves_a_frame_to_another_connection_fails_the_group() -> None:
    # tests/relay.py between rank 0 and rank 1 (test_man_in_the_middle's setting, with a
    # token): rank 0's first data frame is taken off its connection and sent ahead of the
    # next data frame on another of its connections to rank 1.
    reports = [
        r.value
        for r in run_ranks(
            test_man_in_the_middle._relayed_allreduces,
            2,
            "transplant",
            True,
            spare_ports=1,
            timeout_s=120,
        )
    ]
    assert reports[0]["calls"] >= CONNECTIONS and reports[0]["tampered"] == 1, reports
    for rank, report in enumerate(reports):
        results = report["results"]
        assert "wrong" not in results, f"rank {rank} returned a wrong result: {report}"
        assert results[-1].startswith("error: "), f"rank {rank} never failed: {report}"
        assert "from rank 0 to rank 1" in results[-1], results[-1]
        assert "failed authentication" in results[-1], results[-1]
        assert report["seconds"] < 20, report
