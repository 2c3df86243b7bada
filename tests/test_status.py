"""Seeing inside a running job: the status CLI, the Health service and the flight recorder.

Two spawns. In the first, rank 2 of 3 skips an allreduce behind a token; while ranks 0
and 1 wait in it, rank 0 runs ``python -m torch_grpc_pg.status --store ...`` and checks
that it names rank 2, the op and its sequence number, and that nobody without the token
reads a thing. In the second, a group of 2 fails on a mismatched allreduce; each rank
checks its Health flips to NOT_SERVING and that its flight record was written.
The rest are the CLI's own pieces, without ranks.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import torch.distributed as dist
from test_security import _make_pki

from dist_harness import (
    LOOPBACK,
    HarnessError,
    RankContext,
    backend_under_test,
    free_port,
    init_default_group,
    run_ranks,
    store_barrier,
)
from torch_grpc_pg import status
from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb

TOKEN = "status-test-token"
NUMEL = 1000
CLI = (sys.executable, "-m", "torch_grpc_pg.status")
SERVING, NOT_SERVING = 1, 2
FAULT_TIMEOUT = timedelta(seconds=10)
POLL_S = 30.0

needs_grpc = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="reads the grpc backend's servers"
)


def _backend() -> Any:
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _poll(read: Any, done: Any, what: str, timeout_s: float = POLL_S) -> Any:
    """``read()`` until ``done(value)``; the last value, or TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:.0f}s; last: {value!r}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- a hung job


def _hung_job(ctx: RankContext, env: dict[str, str]) -> dict[str, Any]:
    """Every rank does allreduce #1; ranks 0 and 1 then start #2, which rank 2 withholds
    until rank 0 has looked at the job. Whatever prefix the group's store has, the
    servers' registry lands at the store's root, where ``--store`` looks, as in a real job."""
    os.environ.update(env)
    store = ctx.store()
    init_default_group(ctx)
    first = torch.full((NUMEL,), float(ctx.rank + 1))
    dist.all_reduce(first)
    second = torch.full((NUMEL,), float(10 * (ctx.rank + 1)))
    out: dict[str, Any] = {"first": first.tolist()}
    work = None if ctx.rank == 2 else dist.all_reduce(second, async_op=True)
    if ctx.rank == 0:
        try:
            out.update(_look_at_hang(ctx))
        finally:
            store.set("release", "1")
    if ctx.rank == 2:
        store.wait(["release"])
        work = dist.all_reduce(second, async_op=True)
    assert work is not None
    work.wait()
    out["second"] = second.tolist()
    return out


def _look_at_hang(ctx: RankContext) -> dict[str, Any]:
    """Rank 0, while it waits: the CLI with the job's credentials (from the environment,
    as the ranks have them), then with each of them missing or wrong."""
    addresses = status.discover_servers(ctx.store())
    creds = status.Credentials(
        token=os.environ["TORCH_GRPC_PG_AUTH_TOKEN"],
        tls_ca=os.environ["TORCH_GRPC_PG_TLS_CA"],
        tls_cert=os.environ["TORCH_GRPC_PG_TLS_CERT"],
        tls_key=os.environ["TORCH_GRPC_PG_TLS_KEY"],
    )
    # Until ranks 0 and 1 both wait (rank 1 may not have started #2 yet).
    _poll(
        lambda: status.group_views(status.read_ranks(addresses, creds, 10)),
        lambda views: bool(views) and views[0].culprit is not None,
        "no culprit named",
    )
    no_cert = ["--tls-cert", "", "--tls-key", ""]
    return {
        "addresses": addresses,
        "cli_json": _run_cli(
            ["--store", f"tcp://{LOOPBACK}:{ctx.store_port}", "--json"]
        ),
        "cli_text": _main(addresses, "--tls-server-name", "localhost"),
        "cli_wrong_name": _main(addresses, "--tls-server-name", "not-in-the-cert"),
        "cli_no_token": _main(addresses, "--token", ""),
        "cli_wrong_token": _main(addresses, "--token", "a-guess"),
        "cli_no_tls": _main(addresses, "--tls-ca", "", *no_cert),
        "cli_no_client_cert": _main(addresses, *no_cert),
        "read_no_token": _read_status_error(addresses[0], creds),
        "unchecked_observer": _unchecked_observer(addresses[0], creds),
    }


def _run_cli(args: list[str]) -> tuple[int, str, str]:
    """The CLI as a user runs it, its credentials from the TORCH_GRPC_PG_* variables."""
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stdout, done.stderr


def _main(addresses: list[str], *args: str) -> tuple[int, str, str]:
    """The CLI's main() in this process: exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = status.main([*addresses, *args, "--timeout", "10"])
    return code, out.getvalue(), err.getvalue()


def _read_status_error(address: str, creds: status.Credentials) -> str:
    """wire.read_status over the job's TLS, without the token."""
    from torch_grpc_pg import wire

    try:
        wire.read_status(address, credentials=creds.channel_credentials())
    except PermissionError as exc:
        return str(exc)
    return "read the status"


def _unchecked_observer(address: str, creds: status.Credentials) -> dict[str, str]:
    """An observer over the job's TLS that skips checking the server and proves no token:
    the server refuses it, and sends no status."""
    from torch_grpc_pg import wire

    link, welcome = wire.handshake(
        address,
        "",
        wire.OBSERVER_RANK,
        0,
        0,
        "",
        check_server=False,
        credentials=creds.channel_credentials(),
    )
    got_status = False
    with contextlib.suppress(grpc.RpcError, StopIteration):
        got_status = link.reply().HasField("status")
    code, details = link.status()
    link.close()
    return {
        "welcomed": str(welcome is not None),
        "refusal": details,
        "got_status": str(got_status),
        "code": code.name,
    }


def _spawn_once(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn()`` once per module, for every test that asserts on it; a failed spawn fails
    each of them with its report instead of spawning again."""

    @functools.cache
    def outcome() -> tuple[Any, str | None]:
        try:
            return fn(), None
        except HarnessError as exc:
            return None, str(exc)

    def get() -> Any:
        value, failure = outcome()
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        return value

    return get


@_spawn_once
def _hung() -> dict[str, Any]:
    """The hung job, under mutual TLS and a token."""
    with tempfile.TemporaryDirectory(prefix="grpc-pg-status-") as pki:
        env = _make_pki(Path(pki)) | {"TORCH_GRPC_PG_AUTH_TOKEN": TOKEN}
        results = run_ranks(_hung_job, 3, env, timeout_s=150)
    return {"ranks": [res.value for res in results], "seen": results[0].value}


@needs_grpc
def test_cli_names_the_rank_that_skipped_the_allreduce() -> None:
    seen = _hung()["seen"]
    code, stdout, stderr = seen["cli_json"]
    assert code == 0, stderr
    report = json.loads(stdout)
    assert len(report["ranks"]) == 3, report["ranks"]
    (group,) = report["groups"]
    culprit = group["culprit"]
    assert culprit["ranks"] == [2], culprit
    assert culprit["reason"] == "behind", culprit
    assert culprit["op"] == "allreduce", culprit
    assert culprit["seq"] == 2, culprit
    assert culprit["waiters"] == [0, 1], culprit
    ranks = group["ranks"]
    assert ranks["2"]["last_seq"] == "1", ranks["2"]
    for r in ("0", "1"):
        assert ranks[r]["last_seq"] == "2", ranks[r]
        assert ranks[r]["waiting"]["op"] == "allreduce", ranks[r]
        assert ranks[r]["waiting"]["seq"] == "2", ranks[r]
        recent = [(op["seq"], op["outcome"]) for op in ranks[r]["recent"]]
        assert recent == [("1", "ok"), ("2", "running")], recent
    # Which peer each waits for depends on the algorithm; someone waits for rank 2.
    assert 2 in {ranks[r]["waiting"]["peer"] for r in ("0", "1")}, ranks
    assert "rank 2" in culprit["message"] and "#2" in culprit["message"], culprit


@needs_grpc
def test_cli_text_shows_the_table_and_the_culprit() -> None:
    code, stdout, stderr = _hung()["seen"]["cli_text"]
    assert code == 0, stderr
    assert "likely culprit: rank 2 — ranks 0, 1 wait in allreduce #2" in stdout, stdout
    assert "rank 2 has issued only up to #1" in stdout, stdout
    for column in status.COLUMNS:
        assert column in stdout, stdout


@needs_grpc
def test_the_hung_job_completes_once_released() -> None:
    for rank, value in enumerate(_hung()["ranks"]):
        assert value["first"] == [6.0] * NUMEL, f"rank {rank}: allreduce #1"
        assert value["second"] == [60.0] * NUMEL, f"rank {rank}: allreduce #2"


@needs_grpc
@pytest.mark.parametrize("case", ["cli_no_token", "cli_wrong_token"])
def test_cli_without_the_token_reads_nothing(case: str) -> None:
    code, stdout, stderr = _hung()["seen"][case]
    assert code == status.EXIT_UNREADABLE, (code, stdout, stderr)
    assert "authentication failed" in stderr and "--token" in stderr, stderr
    assert "likely culprit" not in stdout, stdout
    for address in _hung()["seen"]["addresses"]:
        assert address in stderr, stderr


@needs_grpc
@pytest.mark.parametrize(
    ("case", "hint"),
    [
        ("cli_no_tls", "pass --tls-ca"),
        ("cli_no_client_cert", "check --tls-ca"),
        ("cli_wrong_name", "--tls-server-name"),
    ],
)
def test_cli_without_the_tls_settings_reads_nothing(case: str, hint: str) -> None:
    code, stdout, stderr = _hung()["seen"][case]
    assert code == status.EXIT_UNREADABLE, (code, stdout, stderr)
    assert "cannot reach" in stderr and hint in stderr, stderr
    assert "likely culprit" not in stdout, stdout


@needs_grpc
def test_read_status_without_the_token_is_refused() -> None:
    seen = _hung()["seen"]
    # The rank says no more than that it refused: the reason is for a caller that
    # proved the token.
    assert "refused the status request" in seen["read_no_token"], seen["read_no_token"]
    assert "proves it holds" in seen["read_no_token"], seen["read_no_token"]
    unchecked = seen["unchecked_observer"]
    assert unchecked["welcomed"] == "False", unchecked
    assert "refused; a rank tells why only" in unchecked["refusal"], unchecked
    assert unchecked["got_status"] == "False", unchecked
    assert unchecked["code"] == "PERMISSION_DENIED", unchecked


# --------------------------------------------------------------------------- a failed group


def _health(address: str) -> int:
    """grpc.health.v1.Health/Check for the server as a whole ("" service), raw bytes."""
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        reply = check(b"", timeout=10)
    # HealthCheckResponse: field 1 (status) as a varint; absent means UNKNOWN (0).
    return reply[1] if reply[:1] == b"\x08" else 0


def _failing_group(ctx: RankContext) -> dict[str, Any]:
    os.environ["TORCH_GRPC_PG_FLIGHT_RECORDER_DIR"] = ctx.tmp_dir
    init_default_group(ctx, FAULT_TIMEOUT)
    address = _backend().tcp_address
    out: dict[str, Any] = {"before": _health(address)}
    dist.all_reduce(torch.ones(NUMEL))  # #1, fine
    store_barrier(ctx.store(), ctx.world_size, "fail together")
    try:
        dist.all_reduce(torch.ones(NUMEL + ctx.rank))  # #2, counts differ
        out["error"] = ""
    except RuntimeError as exc:
        out["error"] = str(exc)
    out["after"] = _poll(
        lambda: _health(address), lambda h: h == NOT_SERVING, "still SERVING", 10
    )
    reply = status.read_rank(address, status.Credentials(), 10)
    out["failure"] = reply.groups[0].failure
    (group,) = [g for g in reply.groups if not g.group_key.endswith("/p2p")]
    out["recent"] = [(r.seq, r.outcome) for r in group.recent]
    dumps = sorted(Path(ctx.tmp_dir).glob(f"torch_grpc_pg-rank{ctx.rank}-*.json"))
    out["dumps"] = [json.loads(p.read_text()) for p in dumps]
    return out


@_spawn_once
def _failed() -> list[dict[str, Any]]:
    return [res.value for res in run_ranks(_failing_group, 2, timeout_s=120)]


@needs_grpc
def test_health_flips_to_not_serving_when_the_group_fails() -> None:
    for rank, seen in enumerate(_failed()):
        assert seen["error"], f"rank {rank}: the mismatched allreduce returned"
        assert seen["before"] == SERVING, f"rank {rank}: {seen['before']}"
        assert seen["after"] == NOT_SERVING, f"rank {rank}: {seen['after']}"
        assert seen["failure"], f"rank {rank}: the status shows no failure"


@needs_grpc
def test_failed_group_leaves_a_flight_record() -> None:
    for rank, seen in enumerate(_failed()):
        assert len(seen["dumps"]) == 1, f"rank {rank}: {seen['dumps']}"
        (dump,) = seen["dumps"]
        assert dump["rank"] == rank and dump["world_size"] == 2, dump
        assert dump["failure"], dump
        # The recorder may spell the op as torch does ("all_reduce").
        ops = [(op["op"].replace("_", ""), op["seq"]) for op in dump["recent"]]
        assert ops == [("allreduce", 1), ("allreduce", 2)], ops
        first, failing = dump["recent"]
        assert first["outcome"] == "ok", first
        assert failing["outcome"] not in ("ok", "running", "queued"), failing
        assert "allreduce" in failing["outcome"], failing


@needs_grpc
def test_status_shows_the_failed_op_with_its_error() -> None:
    for rank, seen in enumerate(_failed()):
        (first, failing) = seen["recent"]
        assert first == (1, "ok"), f"rank {rank}: {seen['recent']}"
        assert failing[0] == 2 and "allreduce" in failing[1], f"rank {rank}: {failing}"


# --------------------------------------------------------------------------- the CLI alone


def _group(
    rank: int,
    last_seq: int,
    wait: tuple[int, int] | None = None,
    running: int = 0,
    world: int = 3,
) -> pb.GroupStatus:
    """Rank ``rank`` of group "g"; ``wait``: (peer, seq) of an allreduce it waits in."""
    g = pb.GroupStatus(group_key="g", rank=rank, world_size=world, last_seq=last_seq)
    g.links.extend("self" if p == rank else "open" for p in range(world))
    if wait is not None:
        g.waiting.CopyFrom(pb.Wait(peer=wait[0], op="allreduce", seq=wait[1]))
    if running:
        g.recent.append(pb.OpRecord(op="allreduce", seq=running, outcome="running"))
    return g


def _views(*groups: pb.GroupStatus) -> list[status.GroupView]:
    reads = [
        status.RankRead(
            f"h:{g.rank}", reply=pb.StatusReply(host="h", pid=g.rank + 1, groups=[g])
        )
        for g in groups
    ]
    return status.group_views(reads)


def test_culprit_is_the_rank_behind_in_sequence() -> None:
    (view,) = _views(_group(0, 5, (2, 5), 5), _group(1, 5, (2, 5), 5), _group(2, 4))
    assert view.culprit is not None
    assert view.culprit.ranks == [2] and view.culprit.reason == "behind"
    assert view.culprit.message == (
        "likely culprit: rank 2 — ranks 0, 1 wait in allreduce #5; "
        "rank 2 has issued only up to #4"
    )


def test_culprit_is_the_rank_waited_for_that_waits_for_nobody() -> None:
    # All issued #5; rank 1 sits in it without waiting for a frame (computing, or stuck).
    (view,) = _views(
        _group(0, 5, (1, 5), 5), _group(1, 5, None, 5), _group(2, 5, (0, 5), 5)
    )
    assert view.culprit is not None
    assert view.culprit.ranks == [1] and view.culprit.reason == "waited_for"
    assert "rank 0 waits for it in allreduce #5" in view.culprit.message
    assert "rank 1 runs allreduce #5 and waits for nobody" in view.culprit.message


def test_culprit_whose_status_could_not_be_read() -> None:
    (view,) = _views(_group(0, 5, (2, 5), 5), _group(1, 5, (2, 5), 5))
    assert view.missing == [2]
    assert view.culprit is not None
    assert view.culprit.ranks == [2] and view.culprit.reason == "unreadable"


def test_no_culprit_while_nobody_waits() -> None:
    (view,) = _views(_group(0, 5), _group(1, 5), _group(2, 4, running=4))
    assert view.culprit is None
    reads = [status.RankRead("h:0", reply=pb.StatusReply())]
    assert "no rank waits for a peer" in status.render_text(reads, [view])


def test_failures_are_shown_in_full_below_the_table() -> None:
    failed = _group(1, 5, (0, 5), 5)
    failed.failure = "allreduce #5: rank 0 sent 1001 elements, rank 1 expects 1000"
    reads = [status.RankRead("h:0", reply=pb.StatusReply())]
    text = status.render_text(reads, _views(_group(0, 5), failed, _group(2, 5)))
    assert f"rank 1 failed: {failed.failure}" in text, text
    assert "no rank waits for a peer" not in text, text


def test_a_process_reached_at_two_addresses_counts_once() -> None:
    reply = pb.StatusReply(host="h", pid=7, groups=[_group(0, 1, world=1)])
    reads = [status.RankRead("a:1", reply=reply), status.RankRead("b:1", reply=reply)]
    (view,) = status.group_views(reads)
    assert list(view.rows) == [0] and view.rows[0].target == "a:1"


def test_text_table_summarises_links_and_waits() -> None:
    g = _group(0, 5, (2, 5), 5)
    g.links[2] = "broken: connection reset"
    g.waiting.offset, g.waiting.seconds = 4096, 12.5
    reads = [status.RankRead("h:0", reply=pb.StatusReply())]
    text = status.render_text(reads, _views(g, _group(1, 5), _group(2, 5)))
    assert "1 open, 1 broken (rank 2)" in text, text
    assert "rank 2 in allreduce #5 @4096 for 12.5s" in text, text


def test_discovery_reads_the_registry_and_drops_duplicates() -> None:
    store = dist.HashStore()
    assert status.discover_servers(store) == []
    assert not store.check([status.SERVERS_COUNT_KEY]), "looking wrote to the store"
    for address in ("h:1", "h:2", "h:1"):
        i = store.add(status.SERVERS_COUNT_KEY, 1)
        store.set(status.SERVERS_KEY.format(i), address)
    store.add(status.SERVERS_COUNT_KEY, 1)  # counted, not yet written: skipped
    assert status.discover_servers(store) == ["h:1", "h:2"]


def test_unreachable_rank_exits_nonzero_saying_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = f"{LOOPBACK}:{free_port()}"
    assert status.main([target, "--timeout", "5"]) == status.EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert f"cannot reach {target}" in err and "still running" in err, err


def test_unreachable_store_exits_nonzero_saying_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"tcp://{LOOPBACK}:{free_port()}"
    assert status.main(["--store", url, "--timeout", "2"]) == status.EXIT_SETUP
    err = capsys.readouterr().err
    assert "cannot connect to the store" in err and "MASTER_ADDR" in err, err


@pytest.mark.parametrize(
    "argv",
    [[], ["h:1", "--store", "tcp://h:2"], ["h:1", "--watch", "0"]],
    ids=["nothing", "both", "bad-watch"],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        status.main(argv)
    assert exc.value.code == 2


def test_store_url_must_be_tcp(capsys: pytest.CaptureFixture[str]) -> None:
    assert status.main(["--store", "http://h:2"]) == status.EXIT_SETUP
    assert "tcp://HOST:PORT" in capsys.readouterr().err


def test_watch_redraws_the_screen_and_keeps_going_on_errors() -> None:
    target = f"{LOOPBACK}:{free_port()}"
    args = status.parse_args([target, "--watch", "--timeout", "5"])
    assert args.watch == 2.0
    frame = status._watch_frame(args, status.credentials_from(args))
    assert frame.startswith(status.CLEAR_SCREEN) and f"cannot reach {target}" in frame
    args = status.parse_args([target, "--watch", "1", "--json", "--timeout", "5"])
    line = status._watch_frame(args, status.credentials_from(args))
    assert (
        line.count("\n") == 1
        and "cannot reach" in json.loads(line)["ranks"][0]["error"]
    )


def test_missing_tls_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "ca.pem"
    assert status.main(["h:1", "--tls-ca", str(missing)]) == status.EXIT_SETUP
    assert "cannot read the --tls-ca file" in capsys.readouterr().err
