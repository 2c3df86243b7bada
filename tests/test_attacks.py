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
OP_POINT_TO_POINT = 11


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

# What a caller that has not proved the token hears, whatever the reason.
REFUSED = "refused; a rank tells why only to a caller that proves it holds"


def _inject(
    ctx: RankContext, token: str, attacker_token: str, stream: str
) -> dict[str, object]:
    """Rank 1's process plays a stranger claiming to be rank 1 towards rank 0, on the
    group's collective or point-to-point stream, after init and before any send; then
    the group runs the allreduce and the send the stranger tried to answer for."""
    import wire_client as wc

    if token:
        os.environ["TORCH_GRPC_PG_AUTH_TOKEN"] = token
    init_default_group(ctx)
    backend = _backend()
    addresses = _publish_and_read(ctx, "tcp", backend.tcp_address)
    report: dict[str, object] = {}
    if ctx.rank == 1:
        key = backend.group_key + ("/p2p" if stream == "p2p" else "")
        link, welcome = wc.handshake(
            addresses[0], key, 1, 0, 2, attacker_token, check_server=False
        )
        # The frames that would have answered the next allreduce, or the next recv, with 1000s.
        thousands = b"\x00\x00\x7a\x44" * NUMEL
        link.send_frame(
            wc.data_frame(1, OP_ALLREDUCE, FLOAT32, NUMEL, thousands, reduction=SUM)
        )
        link.send_frame(wc.data_frame(1, OP_POINT_TO_POINT, FLOAT32, NUMEL, thousands))
        code, details = link.status()
        report.update(welcomed=welcome is not None, status=code.name, refusal=details)
        link.close()
    store_barrier(ctx.store(), ctx.world_size, "attacked")
    report["exact"] = _exact_allreduce()
    received = torch.zeros(NUMEL)
    if ctx.rank == 1:
        dist.send(torch.full((NUMEL,), 7.0), dst=0)
    else:
        dist.recv(received, src=1)
        report["received_exact"] = bool(
            torch.equal(received, torch.full((NUMEL,), 7.0))
        )
    return report


@pytest.mark.parametrize("stream", ["collectives", "p2p"])
@pytest.mark.parametrize(
    ("token", "attacker_token", "refusal"),
    [
        ("", "", "already has a stream"),
        (TOKEN, "", REFUSED),
        (TOKEN, "a-guess", REFUSED),
        (TOKEN, TOKEN, "already has a stream"),
    ],
    ids=[
        "no-token",
        "token-attacker-without",
        "token-attacker-guesses",
        "token-attacker-holds-it",
    ],
)
def test_stranger_cannot_answer_for_a_rank(
    token: str, attacker_token: str, refusal: str, stream: str
) -> None:
    results = run_ranks(_inject, 2, token, attacker_token, stream)
    attack = results[1].value
    assert not attack["welcomed"], attack
    assert refusal in attack["refusal"], attack
    assert attack["status"] == "PERMISSION_DENIED", attack
    for res in results:
        assert res.value["exact"], f"rank {res.rank}: the allreduce result changed"
    assert results[0].value["received_exact"], results[0].value


def _claim_after_the_end(ctx: RankContext, token: str) -> dict[str, object]:
    """Rank 1 of a group is played from Python: it sends rank 0 one message on its
    point-to-point stream and ends that stream. A stranger (or rank 1 itself, holding the
    token) then claims rank 1's place again: the place stays taken for the group's life."""
    import wire_client as wc

    import torch_grpc_pg

    store = dist.PrefixStore("claim", ctx.store())
    report: dict[str, object] = {}
    if ctx.rank == 0:
        pg = torch_grpc_pg.ProcessGroupGrpc(
            store,
            0,
            2,
            timedelta(seconds=20),
            "claim",
            **torch_grpc_pg.Options(auth_token=token, unix_sockets=False).as_kwargs(),
        )
        first, second = torch.zeros(NUMEL), torch.zeros(NUMEL)
        pg.recv([first], 1, 0).wait()
        report["first"] = first[0].item()
        store.set("first taken", "1")
        store.wait(["claimed"])
        try:
            pg.recv([second], 1, 0).wait()
            report["second"] = second[0].item()
        except RuntimeError as exc:
            report["second_error"] = str(exc)
        store.set("second done", "1")
    else:
        rank = wc.PythonRank(store, 1, 2, "claim", token=token)
        rank.join()
        link = rank.open(0, p2p=True, unix=False)
        message = wc.data_frame(
            1, OP_POINT_TO_POINT, FLOAT32, NUMEL, b"\x00\x00\x80\x3f" * NUMEL
        )
        link.send_frame(message)
        store.wait(["first taken"])
        # The stream ends cleanly (a half-close, not a cancellation, whose reason reads
        # differently): rank 1 is gone, as far as rank 0 can tell.
        link.end()
        time.sleep(0.5)
        again, welcome = wc.handshake(
            rank.target(0, unix=False), rank.group_key + "/p2p", 1, 0, 2, token
        )
        second = wc.data_frame(
            2, OP_POINT_TO_POINT, FLOAT32, NUMEL, b"\x00\x00\x7a\x44" * NUMEL
        )
        again.send_frame(second)
        # A refused stream has ended with its reason; a welcomed one would run on.
        _, details = again.status() if welcome is None else (None, "welcomed")
        report.update(welcomed=welcome is not None, refusal=details)
        store.set("claimed", "1")
        store.wait(["second done"])
        again.close()
        rank.leave()
    return report


@pytest.mark.parametrize("token", ["", TOKEN], ids=["no-token", "token"])
def test_a_place_stays_taken_after_its_stream_ends(token: str) -> None:
    victim, attacker = (r.value for r in run_ranks(_claim_after_the_end, 2, token))
    assert victim["first"] == 1.0, victim
    assert not attacker["welcomed"], attacker
    assert "already has a stream" in attacker["refusal"], attacker
    # The second receive fails, naming rank 1's end; it never returns the 1000s.
    assert "second" not in victim, victim
    assert "rank 1 closed its connection" in victim["second_error"], victim


# --------------------------------------------------------------------------- a planted server


def _dial_planted_server(ctx: RankContext) -> dict[str, object]:
    """Rank 1's address in the store is the attacker's: rank 0 must refuse it and write no
    frame to it, and the attacker must not learn the token."""
    import wire_client as wc

    import torch_grpc_pg

    planted = wc.PlantedServer(token_guess="")
    port = planted.start()
    store = dist.PrefixStore("planted", ctx.store())

    def plant() -> None:
        # Anyone who reaches the store can join as rank 1 and publish an address
        # (through a client of its own: rank 0's blocks in its waits).
        theirs = dist.PrefixStore("planted", ctx.store())
        instance = wc.join_group_instance(theirs, 1, 2)
        theirs.set(
            f"{wc.RENDEZVOUS}{instance}/endpoint/1",
            f"v1\nelsewhere\n127.0.0.1:{port}\n",
        )

    planter = threading.Thread(target=plant, daemon=True)
    planter.start()
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
    planter.join(timeout=5)
    planted.stop()
    raw = b"".join(h.SerializeToString() for h in planted.hellos) + b"".join(
        planted.messages
    )
    return {
        "error": error,
        "hellos": len(planted.hellos),
        "messages": len(planted.messages),
        "token_seen": TOKEN.encode() in raw,
    }


def test_a_server_planted_in_the_store_is_refused_and_learns_nothing() -> None:
    outcome = run_ranks(_dial_planted_server, 1)[0].value
    assert "could not prove that it holds" in outcome["error"], outcome
    assert outcome["hellos"] >= 1 and outcome["messages"] == 0, outcome
    assert not outcome["token_seen"]


# --------------------------------------------------------------------------- floods


def _send_flood(address: str, kind: str, group_key: str) -> list[str]:
    """Opens one stream per message to ``address`` and sends the message on it without
    authenticating: half of the streams carry no Hello, the other half one whose proof is
    a guess. Returns each stream's status code."""
    import wire_client as wc

    if kind == "huge":
        messages = [b"\x1a" * (512 << 20)] * 4  # four 512 MiB messages
    else:
        big = b"\x0a" * (8 << 20)  # over the receive limit
        medium = b"\x0a" * ((2 << 20) + 1024)  # within it
        messages = [big] * 64 + [medium] * 64
    options = [
        ("grpc.max_send_message_length", -1),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    links = [
        wc.Link(
            address,
            wc.hello(group_key, 1, 0, 2, "a-guess") if i % 2 else None,
            channel_options=options,
        )
        for i in range(len(messages))
    ]
    for link, message in zip(links, messages):
        link.send(message)
    codes = [link.status()[0].name for link in links]
    for link in links:
        link.close()
    return codes


def _flood(ctx: RankContext, token: str, kind: str, unix: bool) -> dict[str, object]:
    """While the two ranks allreduce 1 MiB in a loop, a process that rank 1 starts floods
    rank 0's port with unauthenticated streams; rank 0 samples its own memory."""
    if token:
        os.environ["TORCH_GRPC_PG_AUTH_TOKEN"] = token
    os.environ["TORCH_GRPC_PG_UNIX_SOCKETS"] = "1" if unix else "0"
    init_default_group(ctx)
    backend = _backend()
    addresses = _publish_and_read(ctx, "tcp", backend.tcp_address)
    tensor = torch.ones(256 << 10)
    for _ in range(
        20
    ):  # the allocations a running job keeps are made before the baseline
        dist.all_reduce(tensor)
    store = ctx.store()
    peak, stop = [0], threading.Event()
    if ctx.rank == 0:
        process = psutil.Process()
        baseline = process.memory_info().rss

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], process.memory_info().rss - baseline)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
    else:

        def attack() -> None:
            # A process of its own, as a stranger would be.
            spawn = multiprocessing.get_context("spawn")
            with spawn.Pool(1) as pool:
                codes = pool.apply(_send_flood, (addresses[0], kind, backend.group_key))
            store.set("flood codes", ",".join(codes))

        attacker = threading.Thread(target=attack)
        attacker.start()
    # Both ranks run allreduces until the flood is over, and decide together when to stop.
    rounds, errors, exact = 0, [], True
    while True:
        flood_over = store.check(["flood codes"])
        value = torch.full((256 << 10,), float(ctx.rank + 1))
        try:
            dist.all_reduce(value)
        except RuntimeError as exc:
            errors.append(str(exc))
            break
        exact = exact and bool(torch.equal(value, torch.full_like(value, 3.0)))
        rounds += 1
        stop_now = torch.tensor([1 if flood_over else 0])
        dist.all_reduce(stop_now, op=dist.ReduceOp.MIN)
        if stop_now.item():
            break
    stop.set()
    if ctx.rank == 0:
        sampler.join()
    else:
        attacker.join()
    codes = store.get("flood codes").decode().split(",")
    return {
        "peak_mib": peak[0] / (1 << 20),
        "exact": exact,
        "errors": errors,
        "rounds": rounds,
        "refused": sum(c != "OK" for c in codes),
        "streams": len(codes),
    }


# What a stranger may make a rank hold, at most, while it floods: the bound.
FLOOD_MIB = 64


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
@pytest.mark.parametrize(
    ("token", "kind"),
    [("", "many"), (TOKEN, "many"), (TOKEN, "huge")],
    ids=["no-token-many", "token-many", "token-huge"],
)
def test_floods_of_strangers_neither_stop_a_job_nor_grow_its_memory(
    token: str, kind: str, unix: bool
) -> None:
    results = run_ranks(_flood, 2, token, kind, unix, timeout_s=300)
    victim, attacker = results[0].value, results[1].value
    assert attacker["refused"] == attacker["streams"], attacker
    assert victim["peak_mib"] < FLOOD_MIB, victim
    for res in results:
        assert not res.value["errors"], res.value
        assert res.value["exact"] and res.value["rounds"] > 0, res.value


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
    # The server bounds what it buffers per message by the first group's chunk.
    larger = torch_grpc_pg.Options(auth_token=TOKEN, chunk_bytes=4 << 20)
    chunk_error = ""
    try:
        dist.new_group(pg_options=larger)
    except Exception as exc:
        chunk_error = str(exc)
    return {
        "exact": bool(torch.equal(tensor, torch.full((NUMEL,), 3.0))),
        "error": error,
        "chunk_error": chunk_error,
    }


def test_subgroups_inherit_the_token_and_refuse_another() -> None:
    for res in run_ranks(_subgroups, 2):
        assert res.value["exact"], res.value
        assert (
            "with a different auth_token (TORCH_GRPC_PG_AUTH_TOKEN) than the one given"
            in res.value["error"]
        ), res.value
        assert (
            "with a smaller chunk_bytes (TORCH_GRPC_PG_CHUNK_BYTES: 2097152 bytes) than"
            in res.value["chunk_error"]
        ), res.value
