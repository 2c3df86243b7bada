"""Attacks on a rank's server, from a grpcio client built from protos/ (tests/wire_client.py).

Each attack runs against real spawned ranks on loopback, with and without a token. Each
must be refused, a rank's memory must stay bounded, and the running group's results exact.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import stat
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    RankContext,
    backend_under_test,
    init_default_group,
    run_ranks,
    store_barrier,
)

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="attacks on the grpc backend's server"
)

TOKEN = "the-real-token"
NUMEL = 1000
OP_ALLREDUCE, FLOAT32, SUM = 1, 1, 1


def _backend() -> object:
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _publish_and_read(ctx: RankContext, key: str, value: str) -> list[str]:
    """Every rank's `value` for `key`, through the test's store."""
    store = ctx.store()
    store.set(f"{key}/{ctx.rank}", value)
    return [store.get(f"{key}/{r}").decode() for r in range(ctx.world_size)]


def _exact_allreduce() -> bool:
    tensor = torch.full((NUMEL,), float(dist.get_rank() + 1))
    dist.all_reduce(tensor)
    expected = dist.get_world_size() * (dist.get_world_size() + 1) / 2
    return bool(torch.equal(tensor, torch.full((NUMEL,), expected)))


# --------------------------------------------------------------------------- injection


def _inject(ctx: RankContext, token: str, attacker_token: str) -> dict[str, object]:
    """Rank 1's process plays a stranger claiming to be rank 1 towards rank 0, then the
    group runs the allreduce the stranger tried to answer for."""
    import wire_client as wc

    if token:
        os.environ["TORCH_GRPC_PG_AUTH_TOKEN"] = token
    init_default_group(ctx)
    backend = _backend()
    addresses = _publish_and_read(ctx, "tcp", backend.tcp_address)
    report: dict[str, object] = {}
    if ctx.rank == 1:
        link, last = wc.handshake(
            addresses[0], backend.group_key, 1, 0, 2, attacker_token, check_server=False
        )
        refusal = (
            last.welcome.error if last.HasField("welcome") else last.challenge.error
        )
        # The frame that would have answered the next allreduce with 1000s.
        link.send_frame(
            wc.data_frame(
                1,
                OP_ALLREDUCE,
                FLOAT32,
                NUMEL,
                b"\x00\x00\x7a\x44" * NUMEL,
                reduction=SUM,
            )
        )
        report["refusal"] = refusal
        report["status"] = link.status()[0].name
        link.close()
    store_barrier(ctx.store(), ctx.world_size, "attacked")
    report["exact"] = _exact_allreduce()
    return report


@pytest.mark.parametrize(
    ("token", "attacker_token", "refusal"),
    [
        ("", "", "already has a stream open"),
        (TOKEN, "", "authentication failed"),
        (TOKEN, "a-guess", "authentication failed"),
        (TOKEN, TOKEN, "already has a stream open"),
    ],
    ids=[
        "no-token",
        "token-attacker-without",
        "token-attacker-guesses",
        "token-attacker-holds-it",
    ],
)
def test_stranger_cannot_answer_for_a_rank(
    token: str, attacker_token: str, refusal: str
) -> None:
    results = run_ranks(_inject, 2, token, attacker_token)
    attack = results[1].value
    assert refusal in attack["refusal"], attack
    assert attack["status"] == "PERMISSION_DENIED", attack
    for res in results:
        assert res.value["exact"], f"rank {res.rank}: the allreduce result changed"


def _replay(ctx: RankContext) -> dict[str, str]:
    """A proof captured from one handshake is worthless in the next: the nonces differ."""
    import wire_client as wc

    os.environ["TORCH_GRPC_PG_AUTH_TOKEN"] = TOKEN
    init_default_group(ctx)
    backend = _backend()
    addresses = _publish_and_read(ctx, "tcp", backend.tcp_address)
    out: dict[str, str] = {}
    if ctx.rank == 0:
        # A handshake as a captured one: the proof over its server's nonce.
        first = wc.Link(addresses[1])
        hello = wc.hello(backend.group_key, 0, 1, 2)
        first.send_frame(hello)
        old = first.reply().challenge
        captured = wc.proof(
            TOKEN, "client", backend.group_key, 0, 1, 2, hello.hello.nonce, old.nonce
        )
        first.close()
        # Replayed with the same Hello on a new stream: the server's nonce is new.
        second = wc.Link(addresses[1])
        second.send_frame(hello)
        new = second.reply().challenge
        second.send_frame(wc.pb.Frame(proof=wc.pb.Proof(proof=captured)))
        out["nonce_changed"] = str(new.nonce != old.nonce)
        out["refusal"] = second.reply().welcome.error
        second.close()
    store_barrier(ctx.store(), ctx.world_size, "replayed")
    out["exact"] = str(_exact_allreduce())
    return out


def test_a_captured_proof_cannot_be_replayed() -> None:
    results = run_ranks(_replay, 2)
    assert results[0].value["nonce_changed"] == "True"
    assert "authentication failed" in results[0].value["refusal"], results[0].value
    assert all(r.value["exact"] == "True" for r in results)


# --------------------------------------------------------------------------- a planted server


def _dial_planted_server(ctx: RankContext) -> dict[str, object]:
    """Rank 1's address in the store is the attacker's: rank 0 must refuse it, and the
    attacker must learn nothing it can replay (no Proof, no token)."""
    import wire_client as wc

    import torch_grpc_pg

    planted = wc.PlantedServer(token_guess="")
    port = planted.start()
    store = dist.PrefixStore("planted", ctx.store())
    prefix = "torch_grpc_pg/0/"
    store.set(prefix + "endpoint/1", f"v1\nelsewhere\n127.0.0.1:{port}\n")
    error = ""
    try:
        torch_grpc_pg.ProcessGroupGrpc(
            store,
            0,
            2,
            timedelta(seconds=20),
            "planted",
            **torch_grpc_pg.Options(
                auth_token=TOKEN,
                connect_timeout=timedelta(seconds=3),
                bind_host="127.0.0.1",
                advertise_host="127.0.0.1",
            ).as_kwargs(),
        )
    except Exception as exc:
        error = str(exc)
    planted.stop()
    kinds = [[f.name for f, _ in m.ListFields()] for m in planted.received]
    raw = b"".join(m.SerializeToString() for m in planted.received)
    return {"error": error, "kinds": kinds, "token_seen": TOKEN.encode() in raw}


def test_a_server_planted_in_the_store_is_refused_and_learns_nothing() -> None:
    outcome = run_ranks(_dial_planted_server, 1)[0].value
    assert "could not prove that it holds" in outcome["error"], outcome
    assert outcome["kinds"] == [["hello"]], outcome
    assert not outcome["token_seen"]


# --------------------------------------------------------------------------- memory bounds


def _send_flood(address: str, kind: str) -> list[str]:
    """Opens one stream per message to ``address``, sends it unauthenticated, returns each
    stream's status code."""
    import wire_client as wc

    if kind == "huge":
        messages = [b"\x1a" * (512 << 20)] * 4  # four 512 MiB handshakes
    else:
        big = b"\x0a" * (8 << 20)  # over the receive limit
        medium = b"\x0a" * ((2 << 20) + 1024)  # within it, far over a Hello's
        messages = [big] * 64 + [medium] * 64
    options = [
        ("grpc.max_send_message_length", -1),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    links = [wc.Link(address, options) for _ in messages]
    for link, message in zip(links, messages):
        link.send(message)
    codes = [link.status()[0].name for link in links]
    for link in links:
        link.close()
    return codes


def _flood(ctx: RankContext, token: str, kind: str) -> dict[str, object]:
    """A process that rank 1 starts floods rank 0's server with unauthenticated messages on
    many streams while rank 0 samples its own memory; then the group runs an allreduce."""
    if token:
        os.environ["TORCH_GRPC_PG_AUTH_TOKEN"] = token
    init_default_group(ctx)
    backend = _backend()
    addresses = _publish_and_read(ctx, "tcp", backend.tcp_address)
    _exact_allreduce()
    peak = [0]
    stop = threading.Event()
    if ctx.rank == 0:
        process = psutil.Process()
        baseline = process.memory_info().rss

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], process.memory_info().rss - baseline)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
    store_barrier(ctx.store(), ctx.world_size, "flood start")
    codes: list[str] = []
    if ctx.rank == 1:
        # The attacker is a process of its own, as a stranger would be: what its
        # gRPC client does at exit is no part of either rank's.
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(1) as pool:
            codes = pool.apply(_send_flood, (addresses[0], kind))
    store_barrier(ctx.store(), ctx.world_size, "flood end")
    stop.set()
    if ctx.rank == 0:
        sampler.join()
    try:
        exact, error = _exact_allreduce(), ""
    except RuntimeError as exc:
        exact, error = False, str(exc)
    return {
        "peak_mib": peak[0] / (1 << 20),
        "exact": exact,
        "error": error,
        "refused": sum(c != "OK" for c in codes),
        "streams": len(codes),
    }


# The server's memory quota at world 2: 128 MiB of reserve plus 2 x (8 queued chunks and a
# 16 MiB window) for the one peer on each of the group's two streams (collectives and
# point-to-point), about 256 MiB. Without it, the four 512 MiB messages alone took gigabytes.
QUOTA_MIB = 256


@pytest.mark.parametrize("token", ["", TOKEN], ids=["no-token", "token"])
def test_unauthenticated_floods_are_refused_and_bounded(token: str) -> None:
    results = run_ranks(_flood, 2, token, "many", timeout_s=300)
    victim, attacker = results[0].value, results[1].value
    assert attacker["refused"] == attacker["streams"] == 128, attacker
    assert victim["peak_mib"] < QUOTA_MIB + 64, victim
    for res in results:
        assert res.value["exact"], res.value


def test_oversized_messages_are_bounded_by_the_memory_quota() -> None:
    results = run_ranks(_flood, 2, "", "huge", timeout_s=300)
    victim, attacker = results[0].value, results[1].value
    assert attacker["refused"] == attacker["streams"] == 4, attacker
    # The quota is enforced as gRPC allocates, so four connections can overshoot it
    # before it reclaims: bounded, not exact (without it: gigabytes).
    assert victim["peak_mib"] < 2 * QUOTA_MIB, victim
    # gRPC reads a whole message before it checks its size; at the quota it sheds
    # connections, and it may shed the group's own. The group then fails loudly on every
    # rank; it never returns a wrong result.
    for res in results:
        assert res.value["exact"] or "rank" in res.value["error"], res.value


# --------------------------------------------------------------------------- local exposure


def _socket_modes(ctx: RankContext, stale_pid: int) -> dict[str, object]:
    stale = Path(ctx.tmp_dir) / f"torch-grpc-pg-{stale_pid}-abcdef"
    stale.mkdir()
    (stale / "rank.sock").write_bytes(b"")
    os.environ["TMPDIR"] = ctx.tmp_dir
    os.umask(0)  # the loosest umask: modes must not depend on it
    init_default_group(ctx)
    path = Path(_backend().unix_socket)
    return {
        "dir_mode": stat.S_IMODE(path.parent.stat().st_mode),
        "socket_mode": stat.S_IMODE(path.stat().st_mode),
        "stale_left": stale.exists(),
        "address": _backend().tcp_address,
    }


def test_unix_socket_is_private_and_stale_ones_are_removed() -> None:
    dead = psutil.Popen(["true"])
    dead.wait()
    outcome = run_ranks(_socket_modes, 1, dead.pid)[0].value
    assert outcome["dir_mode"] == 0o700, outcome
    assert outcome["socket_mode"] == 0o600, outcome
    assert not outcome["stale_left"], outcome
    # The store is on loopback, so the rank listens there and nowhere else.
    assert outcome["address"].startswith("127.0.0.1:"), outcome


def _busy_port(ctx: RankContext, port: int) -> str:
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    blocker.bind(("127.0.0.1", port))
    blocker.listen()
    os.environ["TORCH_GRPC_PG_PORT"] = str(port)
    with pytest.raises(RuntimeError) as info:
        init_default_group(ctx)
    blocker.close()
    return str(info.value)


def test_a_busy_fixed_port_is_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    message = run_ranks(_busy_port, 1, port)[0].value
    assert "port is in use" in message and "TORCH_GRPC_PG_PORT" in message, message


# --------------------------------------------------------------------------- groups share the server's settings


def _subgroups(ctx: RankContext) -> dict[str, object]:
    import torch_grpc_pg

    os.environ.pop("TORCH_GRPC_PG_AUTH_TOKEN", None)
    store = dist.PrefixStore("subgroups", ctx.store())
    dist.init_process_group(
        "grpc",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        pg_options=torch_grpc_pg.Options(auth_token=TOKEN),
    )
    plain = dist.new_group()
    tensor = torch.full((NUMEL,), float(ctx.rank + 1))
    dist.all_reduce(tensor, group=plain)
    error = ""
    try:
        dist.new_group(pg_options=torch_grpc_pg.Options(auth_token="another"))
    except Exception as exc:
        error = str(exc)
    return {
        "exact": bool(torch.equal(tensor, torch.full((NUMEL,), 3.0))),
        "error": error,
    }


def test_subgroups_inherit_the_token_and_refuse_another() -> None:
    for res in run_ranks(_subgroups, 2):
        assert res.value["exact"], res.value
        assert "auth_token (TORCH_GRPC_PG_AUTH_TOKEN)" in res.value["error"], res.value
