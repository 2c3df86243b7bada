"""What every rank of a running job is doing, read from the ranks' own gRPC servers.

    python -m torch_grpc_pg.status HOST:PORT [HOST:PORT ...]
    python -m torch_grpc_pg.status --store tcp://HOST:PORT [--watch [SECONDS]] [--json]

Each rank answers as an observer asks (the handshake of protos/torch_grpc_pg.proto, with
the job's token and TLS settings): its process groups, their links, counters, the op in
flight and what it waits for, and the flight recorder of recent ops. Per process group,
the tool tabulates the ranks and names the likely culprit of a hang: a rank that has not
issued the op the others wait in, or else the rank they wait for that waits for nobody.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import grpc
import torch.distributed as dist
from google.protobuf.json_format import MessageToDict

from torch_grpc_pg import wire
from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb

# Where the ranks publish their servers, at the root of the job's store.
SERVERS_COUNT_KEY = "torch_grpc_pg/servers/count"
SERVERS_KEY = "torch_grpc_pg/servers/{}"

EXIT_OK = 0
EXIT_UNREADABLE = 1  # some rank could not be read
EXIT_SETUP = 2  # the store or this tool's own settings (bad arguments also exit 2)

CLEAR_SCREEN = "\033[H\033[2J"


class StatusError(Exception):
    """A rank or the store could not be read; the message says what to do."""


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """The job's token and TLS files, as the ranks take them (TORCH_GRPC_PG_*)."""

    token: str = field(default="", repr=False)
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS as a rank dials its peers: the CA as roots, the certificate for mutual TLS."""
        if not self.tls:
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise StatusError(
                "TLS needs both a certificate and a key: give --tls-cert and --tls-key "
                "(TORCH_GRPC_PG_TLS_CERT, TORCH_GRPC_PG_TLS_KEY), or neither"
            )
        return grpc.ssl_channel_credentials(
            root_certificates=_read_pem(self.tls_ca, "--tls-ca"),
            private_key=_read_pem(self.tls_key, "--tls-key"),
            certificate_chain=_read_pem(self.tls_cert, "--tls-cert"),
        )

    def channel_options(self) -> list[tuple[str, int | str]]:
        # A status holds up to a whole flight recorder per group: no 4 MiB cap.
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.enable_retries", 0),
        ]
        if self.tls and self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return options


def _read_pem(path: str, flag: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise StatusError(
            f"cannot read the {flag} file {path!r}: {exc.strerror}"
        ) from exc


# --------------------------------------------------------------------------- reading a rank


def read_rank(target: str, creds: Credentials, timeout: float) -> pb.StatusReply:
    """One rank's StatusReply, read as an authenticated observer; StatusError if not."""
    try:
        return _observe(target, creds, timeout)
    except grpc.RpcError as exc:
        raise StatusError(_explain_rpc_error(target, exc, creds)) from None
    except PermissionError as exc:
        raise StatusError(f"{exc}. {_token_hint(creds)}") from None
    except StopIteration:
        raise StatusError(
            f"{target} ended the stream without sending its status: is this the address "
            "of a torch_grpc_pg rank of this version?"
        ) from None


def _observe(target: str, creds: Credentials, timeout: float) -> pb.StatusReply:
    # This tool's own channel options: TLS name, message size, deadline.
    try:
        return wire.read_status(
            target,
            creds.token,
            credentials=creds.channel_credentials(),
            channel_options=creds.channel_options(),
            timeout=timeout,
        )
    except wire.ServerProofError:
        raise PermissionError(
            f"{target} could not prove that it holds this tool's token: it is not a rank "
            "of this job, or something between relays or alters its answer"
        ) from None


def _token_hint(creds: Credentials) -> str:
    without = ", or --token '' for a job without one" if creds.token else ""
    return (
        "Pass the job's token with --token or TORCH_GRPC_PG_AUTH_TOKEN"
        f"{without} (authentication failed)"
    )


def _explain_rpc_error(target: str, exc: grpc.RpcError, creds: Credentials) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    name = code.name if code is not None else "error"
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return f"{target} refused the status request ({name}: {details}). {_token_hint(creds)}"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return (
            f"{target} does not serve torch_grpc_pg ({details or name}): is this the "
            "address of a rank's server (backend.tcp_address)?"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return (
            f"{target} did not answer in time ({details or name}): the address may be "
            "filtered by a firewall; raise --timeout if the rank is merely busy"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        tls = (
            "check --tls-ca / --tls-cert / --tls-key / --tls-server-name"
            if creds.tls
            else "if the ranks use TLS, pass --tls-ca (and --tls-cert/--tls-key for mutual TLS)"
        )
        return (
            f"cannot reach {target} ({details or name}): is the rank still running, and "
            f"is this its server's address (backend.tcp_address)? {tls}"
        )
    return f"{target}: {name}: {details}"


def read_ranks(
    targets: Sequence[str], creds: Credentials, timeout: float
) -> list[RankRead]:
    """Every target's StatusReply or error, read concurrently, in the order given."""

    def one(target: str) -> RankRead:
        try:
            return RankRead(target, reply=read_rank(target, creds, timeout))
        except StatusError as exc:
            return RankRead(target, error=str(exc))

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(targets)))) as pool:
        return list(pool.map(one, targets))


@dataclass
class RankRead:
    """What one server answered, or why it did not."""

    target: str
    reply: pb.StatusReply | None = None
    error: str = ""


# --------------------------------------------------------------------------- the store


def parse_store_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise StatusError(
            f"--store {url!r}: give the job's TCPStore as tcp://HOST:PORT "
            "(MASTER_ADDR:MASTER_PORT under torchrun)"
        )
    return parts.hostname, port


def connect_store(url: str, timeout: float) -> dist.Store:
    """A client of the job's TCPStore, without joining the job."""
    host, port = parse_store_url(url)
    try:
        # A plain connection first: it fails in one clear line where TCPStore would
        # retry and log a stack trace per attempt.
        socket.create_connection((host, port), timeout=timeout).close()
        return dist.TCPStore(
            host,
            port,
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout),
        )
    except Exception as exc:  # OSError, or torch's DistNetworkError, RuntimeError, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StatusError(
            f"cannot connect to the store at {host}:{port} ({reason}): is the job "
            "running, and is this its MASTER_ADDR:MASTER_PORT?"
        ) from None


def discover_servers(store: dist.Store) -> list[str]:
    """The distinct server addresses that the ranks published in ``store`` (a c10d Store)."""
    if not store.check([SERVERS_COUNT_KEY]):  # checked first: add() would create it
        return []
    count = int(store.add(SERVERS_COUNT_KEY, 0))
    keys = [SERVERS_KEY.format(i) for i in range(1, count + 1)]
    addresses: list[str] = []
    for key in keys:
        if not store.check([key]):  # counted, not yet written
            continue
        address = bytes(store.get(key)).decode()
        if address not in addresses:
            addresses.append(address)
    return addresses


# --------------------------------------------------------------------------- analysis


@dataclass
class RankRow:
    """One rank of one process group, as its process reported it."""

    target: str
    status: pb.GroupStatus


@dataclass
class GroupView:
    """One process group across the job: its ranks' rows and the verdict."""

    group_key: str
    world_size: int
    rows: dict[int, RankRow] = field(default_factory=dict)
    culprit: Culprit | None = None
    # The group's point-to-point channel (send/recv), per rank that reported it.
    point_to_point: dict[int, pb.GroupStatus] = field(default_factory=dict)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.rows]


@dataclass
class Culprit:
    """The likely culprit of a hang in one group, and why."""

    ranks: list[int]
    op: str
    seq: int
    waiters: list[int]
    reason: str  # "behind", "waited_for" or "unreadable"
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "op": self.op,
            "seq": self.seq,
            "waiters": self.waiters,
            "reason": self.reason,
            "message": self.message,
        }


# A group's send/recv messages travel on a channel of their own, reported
# under the group's key with this suffix; its numbers count messages per pair
# of ranks, not the group's collectives, so it stays out of the verdict.
P2P_SUFFIX = "/p2p"


def group_views(reads: Iterable[RankRead]) -> list[GroupView]:
    """The replies regrouped per process group; a process reached twice counts once."""
    views: dict[str, GroupView] = {}
    channels: dict[str, dict[int, pb.GroupStatus]] = {}
    seen: set[tuple[str, int]] = set()
    for read in reads:
        if read.reply is None:
            continue
        process = (read.reply.host, read.reply.pid)
        if process in seen:
            continue
        seen.add(process)
        for status in read.reply.groups:
            if status.group_key.endswith(P2P_SUFFIX):
                parent = status.group_key[: -len(P2P_SUFFIX)]
                channels.setdefault(parent, {}).setdefault(status.rank, status)
                continue
            view = views.setdefault(
                status.group_key, GroupView(status.group_key, status.world_size)
            )
            view.rows.setdefault(status.rank, RankRow(read.target, status))
    for view in views.values():
        view.culprit = find_culprit(view)
        view.point_to_point = channels.get(view.group_key, {})
    return sorted(views.values(), key=lambda v: (-v.world_size, v.group_key))


def find_culprit(view: GroupView) -> Culprit | None:
    """A rank behind in sequence, else the rank waited for that itself waits for nobody."""
    waiting = {r: row.status.waiting for r, row in view.rows.items() if _waits(row)}
    if not waiting:
        return None
    seq = max(w.seq for w in waiting.values())
    op = next(w.op for w in waiting.values() if w.seq == seq)
    waiters = sorted(r for r, w in waiting.items() if w.seq == seq)
    return (
        _behind(view, op, seq, waiters)
        or _waited_for(view, waiting, op, seq, waiters)
        or _unreadable(view, waiting, op, seq, waiters)
    )


def _waits(row: RankRow) -> bool:
    return row.status.HasField("waiting")


def _behind(view: GroupView, op: str, seq: int, waiters: list[int]) -> Culprit | None:
    behind = {
        r: row.status.last_seq
        for r, row in view.rows.items()
        if row.status.last_seq < seq
    }
    if not behind:
        return None
    lowest = min(behind.values())
    ranks = sorted(r for r, last in behind.items() if last == lowest)
    issued = f"has issued only up to #{lowest}" if lowest else "has issued no op yet"
    message = (
        f"likely culprit: {_ranks(ranks)} — {_ranks(waiters)} "
        f"{_verb(waiters, 'wait')} in {op} #{seq}; {_ranks(ranks)} {issued}"
    )
    return Culprit(ranks, op, seq, waiters, "behind", message)


def _waited_for(
    view: GroupView, waiting: dict[int, pb.Wait], op: str, seq: int, waiters: list[int]
) -> Culprit | None:
    peers = sorted({w.peer for w in waiting.values()} - set(waiting))
    ranks = [p for p in peers if p in view.rows]
    if not ranks:
        return None
    waiting_for = sorted(r for r, w in waiting.items() if w.peer in ranks)
    doing = "; ".join(f"rank {r} {_activity(view.rows[r].status)}" for r in ranks)
    message = (
        f"likely culprit: {_ranks(ranks)} — {_ranks(waiting_for)} "
        f"{_verb(waiting_for, 'wait')} for it in {op} #{seq}; {doing}"
    )
    return Culprit(ranks, op, seq, waiters, "waited_for", message)


def _unreadable(
    view: GroupView, waiting: dict[int, pb.Wait], op: str, seq: int, waiters: list[int]
) -> Culprit | None:
    ranks = sorted({w.peer for w in waiting.values()} & set(view.missing))
    if not ranks:
        return None
    message = (
        f"likely culprit: {_ranks(ranks)} — {_ranks(waiters)} "
        f"{_verb(waiters, 'wait')} in {op} #{seq} for {_ranks(ranks)}, whose status "
        "this tool does not have (see the errors, if any; give every rank's address, "
        "or --store)"
    )
    return Culprit(ranks, op, seq, waiters, "unreadable", message)


def _activity(status: pb.GroupStatus) -> str:
    running = in_flight(status)
    if running is not None:
        return f"runs {running.op} #{running.seq} and waits for nobody"
    return f"waits for nobody and has issued up to #{status.last_seq}"


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _verb(ranks: Sequence[int], verb: str) -> str:
    return verb + "s" if len(ranks) == 1 else verb


def in_flight(status: pb.GroupStatus) -> pb.OpRecord | None:
    """The op the group's worker runs now, from the flight recorder."""
    return next((r for r in reversed(status.recent) if r.outcome == "running"), None)


# --------------------------------------------------------------------------- text output

COLUMNS = ("rank", "server", "last seq", "in flight", "waits for", "links", "failure")


def render_text(reads: Sequence[RankRead], views: Sequence[GroupView]) -> str:
    """A table per process group and its verdict; errors are printed apart."""
    lines: list[str] = []
    for view in views:
        lines += [*_render_group(view), ""]
    if not any(read.reply is not None for read in reads):
        lines.append("no rank could be read")
    elif not views:
        lines.append(
            "no process group reported (the ranks have none yet, or none is left)"
        )
    return "\n".join(lines).rstrip() + "\n"


def _render_group(view: GroupView) -> list[str]:
    header = f"group {view.group_key or '(unnamed)'}: world size {view.world_size}"
    rows = [_row(rank, row) for rank, row in sorted(view.rows.items())]
    rows += [(str(r), "?", "", "", "", "", "not read") for r in view.missing]
    lines = [header, *_table([COLUMNS, *rows])]
    failed = [(r, row.status.failure) for r, row in sorted(view.rows.items())]
    lines += [f"rank {r} failed: {failure}" for r, failure in failed if failure]
    if view.culprit is not None:
        lines.append(view.culprit.message)
    elif not any(failure for _, failure in failed):
        lines.append("no rank waits for a peer")
    for rank, status in sorted(view.point_to_point.items()):
        if status.HasField("waiting"):
            w = status.waiting
            lines.append(
                f"rank {rank} waits for message #{w.seq} from rank {w.peer} "
                f"({w.seconds:.1f} s so far)"
            )
    return lines


def _row(rank: int, row: RankRow) -> tuple[str, ...]:
    s = row.status
    running = in_flight(s)
    flight = f"{running.op} #{running.seq}" if running is not None else "-"
    return (
        str(rank),
        row.target,
        str(s.last_seq),
        flight,
        _wait_text(s),
        _links_summary(s.links, rank),
        _shorten(s.failure, 60) or "-",
    )


def _wait_text(status: pb.GroupStatus) -> str:
    if not status.HasField("waiting"):
        return "-"
    w = status.waiting
    return f"rank {w.peer} in {w.op} #{w.seq} @{w.offset} for {w.seconds:.1f}s"


def _links_summary(links: Sequence[str], rank: int) -> str:
    """'2 open' or '1 open, 1 broken (rank 2)': peer links by state, self left out."""
    by_state: dict[str, list[int]] = {}
    for peer, state in enumerate(links):
        if peer == rank or state == "self":
            continue
        by_state.setdefault(state.split(":", 1)[0] or "unknown", []).append(peer)
    parts = []
    for state, peers in by_state.items():
        who = "" if state == "open" else f" ({_ranks(peers)})"
        parts.append(f"{len(peers)} {state}{who}")
    return ", ".join(parts) or "-"


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
        for row in rows
    ]


# --------------------------------------------------------------------------- json output


def as_json(reads: Sequence[RankRead], views: Sequence[GroupView]) -> dict[str, Any]:
    return {
        "ranks": [_read_dict(read) for read in reads],
        "groups": [_view_dict(view) for view in views],
    }


def _read_dict(read: RankRead) -> dict[str, Any]:
    out: dict[str, Any] = {"target": read.target}
    if read.reply is not None:
        out["status"] = _message_dict(read.reply)
    if read.error:
        out["error"] = read.error
    return out


def _view_dict(view: GroupView) -> dict[str, Any]:
    return {
        "group_key": view.group_key,
        "world_size": view.world_size,
        "ranks": {
            str(rank): {"target": row.target, **_message_dict(row.status)}
            for rank, row in sorted(view.rows.items())
        },
        "missing": view.missing,
        "culprit": None if view.culprit is None else view.culprit.as_dict(),
        "point_to_point": {
            str(rank): _message_dict(status)
            for rank, status in sorted(view.point_to_point.items())
        },
    }


def _message_dict(message: Any) -> dict[str, Any]:
    return MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


# --------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="python -m torch_grpc_pg.status",
        description="Show what every rank of a torch_grpc_pg job is doing, and who holds up a hang.",
    )
    p.add_argument(
        "targets", nargs="*", metavar="HOST:PORT", help="ranks' server addresses"
    )
    p.add_argument(
        "--store",
        metavar="tcp://HOST:PORT",
        help="find every rank through the job's TCPStore",
    )
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable output")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for each rank and for the store (default 10)",
    )
    p.add_argument(
        "--token",
        default=env("TORCH_GRPC_PG_AUTH_TOKEN", ""),
        help="the job's token (default: TORCH_GRPC_PG_AUTH_TOKEN)",
    )
    p.add_argument(
        "--tls-ca",
        default=env("TORCH_GRPC_PG_TLS_CA", ""),
        help="PEM file of the CA of the ranks' certificates (default: TORCH_GRPC_PG_TLS_CA)",
    )
    p.add_argument(
        "--tls-cert",
        default=env("TORCH_GRPC_PG_TLS_CERT", ""),
        help="client certificate for mutual TLS (default: TORCH_GRPC_PG_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        default=env("TORCH_GRPC_PG_TLS_KEY", ""),
        help="its key (default: TORCH_GRPC_PG_TLS_KEY)",
    )
    p.add_argument(
        "--tls-server-name",
        default=env("TORCH_GRPC_PG_TLS_SERVER_NAME", ""),
        help="name expected in the ranks' certificates (default: TORCH_GRPC_PG_TLS_SERVER_NAME)",
    )
    args = p.parse_args(argv)
    if bool(args.targets) == bool(args.store):
        p.error(
            "give the ranks' HOST:PORT addresses, or --store tcp://HOST:PORT (not both)"
        )
    if args.watch is not None and args.watch <= 0:
        p.error("--watch takes a positive number of seconds")
    return args


def credentials_from(args: argparse.Namespace) -> Credentials:
    return Credentials(
        token=args.token,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_server_name=args.tls_server_name,
    )


def snapshot(
    targets: Sequence[str], creds: Credentials, timeout: float
) -> tuple[list[RankRead], list[GroupView]]:
    reads = read_ranks(targets, creds, timeout)
    return reads, group_views(reads)


def render(
    reads: Sequence[RankRead], views: Sequence[GroupView], json_output: bool
) -> str:
    if json_output:
        return json.dumps(as_json(reads, views), indent=2) + "\n"
    return render_text(reads, views)


def errors_text(reads: Sequence[RankRead]) -> str:
    return "".join(f"error: {read.error}\n" for read in reads if read.error)


def find_targets(args: argparse.Namespace) -> list[str]:
    if not args.store:
        return list(args.targets)
    targets = discover_servers(connect_store(args.store, args.timeout))
    if not targets:
        raise StatusError(
            f"no rank has published its server in the store at {args.store} "
            f"({SERVERS_COUNT_KEY} is 0): has the job called init_process_group with the "
            "grpc backend, and is this its store?"
        )
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    creds = credentials_from(args)
    try:
        creds.channel_credentials()  # unreadable TLS files fail here, once
        if args.watch is not None:
            return _watch(args, creds)
        reads, views = snapshot(find_targets(args), creds, args.timeout)
    except StatusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SETUP
    sys.stdout.write(render(reads, views, args.json))
    sys.stderr.write(errors_text(reads))
    return EXIT_UNREADABLE if any(read.error for read in reads) else EXIT_OK


def _watch(args: argparse.Namespace, creds: Credentials) -> int:
    """Until Ctrl-C: the screen redrawn (text), or one JSON document a line (--json)."""
    try:
        while True:
            sys.stdout.write(_watch_frame(args, creds))
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


def _watch_frame(args: argparse.Namespace, creds: Credentials) -> str:
    try:
        # Ranks come and go while watching (new groups, restarts): look them up each time.
        reads, views = snapshot(find_targets(args), creds, args.timeout)
    except StatusError as exc:
        if args.json:
            return json.dumps({"error": str(exc)}) + "\n"
        return f"{CLEAR_SCREEN}error: {exc}\n"
    if args.json:
        return json.dumps(as_json(reads, views)) + "\n"
    stamp = time.strftime("%H:%M:%S")
    head = f"{CLEAR_SCREEN}{stamp}, every {args.watch:g}s; Ctrl-C to stop\n\n"
    return head + render_text(reads, views) + errors_text(reads)


if __name__ == "__main__":
    sys.exit(main())
