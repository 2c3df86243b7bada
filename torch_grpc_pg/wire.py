"""The link handshake and frame protection of protos/torch_grpc_pg.proto in Python, from the
proto alone.

The status tool uses it as an observer; tests use it to play ranks, strangers, replayers and
planted servers. The caller's Hello travels in the call's metadata and the server's Welcome in
its initial metadata; proofs and keys come from the transcript that the proto describes and
csrc/transport/auth.cc writes, byte for byte. Sealing frames (AES-256-GCM) needs the
`cryptography` package, which only tests that write protected frames use.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import struct
import threading
from collections.abc import Sequence

import grpc

from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb

EXCHANGE = "/torch_grpc_pg.ProcessGroupService/Exchange"
PROTOCOL_VERSION = pb.PROTOCOL_VERSION_CURRENT
NONCE_BYTES = 32
TAG_BYTES = 16
OBSERVER_RANK = 0xFFFFFFFF  # what a monitoring tool claims in its Hello
HELLO_KEY = "tgpg-hello-bin"
WELCOME_KEY = "tgpg-welcome-bin"


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def transcript(h: pb.Hello) -> bytes:
    """Every field of a Hello but its proof, laid out as csrc/transport/auth.cc does."""
    return (
        _field(b"torch-grpc-pg link v7")
        + struct.pack("<I", h.protocol_version)
        + _field(h.group_key.encode())
        + struct.pack("<III", h.src_rank, h.dst_rank, h.world_size)
        + _field(h.settings.encode())
        + struct.pack("<II", h.link, h.protection)
        + _field(h.nonce)
    )


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def caller_proof(token: str, h: pb.Hello) -> bytes:
    """What the caller puts in its Hello; empty without a token."""
    if not token:
        return b""
    return _mac(token.encode(), _field(b"caller proof") + transcript(h))


def server_proof(token: str, h: pb.Hello, server_nonce: bytes) -> bytes:
    """What the server puts in its Welcome; empty without a token."""
    if not token:
        return b""
    return _mac(
        token.encode(), _field(b"server proof") + transcript(h) + _field(server_nonce)
    )


def link_keys(token: str, h: pb.Hello, server_nonce: bytes) -> tuple[bytes, bytes]:
    """HKDF-SHA256 of the token: the caller-to-server and server-to-caller keys."""
    salt = hashlib.sha256(transcript(h) + _field(server_nonce)).digest()
    pseudo_random_key = _mac(salt, token.encode())
    return (
        _mac(pseudo_random_key, b"caller to server\x01"),
        _mac(pseudo_random_key, b"server to caller\x01"),
    )


def group_settings(
    chunk_bytes: int = 2 << 20,
    direct_max_bytes: int = 64 << 10,
    tls: bool = False,
    wire_dtype: str = "float32",
    two_level: bool = True,
    connections_per_peer: int = 1,
) -> str:
    """The Hello's `settings`, as the ranks write them (csrc/backend/bindings.cc, and
    csrc/transport/grpc_messenger.cc for TLS)."""
    return (
        f"chunk_bytes={chunk_bytes} direct_max_bytes={direct_max_bytes} "
        f"wire_dtype={wire_dtype} two_level={'on' if two_level else 'off'} "
        f"connections_per_peer={connections_per_peer} tls={'on' if tls else 'off'}"
    )


def protection_for(
    token: str, link: int, tls: bool = False, encrypt: bool = True
) -> int:
    """What protects a caller's frames, as link_protection() in csrc/transport/auth.cc."""
    if not token or link == pb.LINK_KIND_UNIX:
        return pb.PROTECTION_NONE
    return pb.PROTECTION_MAC if tls or not encrypt else pb.PROTECTION_AEAD


def hello(
    group: str,
    src: int,
    dst: int,
    world: int,
    token: str = "",
    *,
    nonce: bytes | None = None,
    settings: str | None = None,
    link: int = pb.LINK_KIND_TCP,
    protection: int | None = None,
) -> pb.Hello:
    """A Hello with the caller's proof over it."""
    if settings is None:
        settings = "" if src == OBSERVER_RANK else group_settings()
    if protection is None:
        observer = src == OBSERVER_RANK
        protection = pb.PROTECTION_NONE if observer else protection_for(token, link)
    h = pb.Hello(
        protocol_version=PROTOCOL_VERSION,
        group_key=group,
        src_rank=src,
        dst_rank=dst,
        world_size=world,
        nonce=nonce if nonce is not None else os.urandom(NONCE_BYTES),
        settings=settings,
        link=link,
        protection=protection,
    )
    h.proof = caller_proof(token, h)
    return h


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def field_bytes(message: bytes, number: int) -> bytes | None:
    """The raw bytes of length-delimited field `number` of an encoded message, as sent."""
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        kind = key & 7
        if kind == 0:
            _, at = _read_varint(message, at)
        elif kind == 2:
            size, at = _read_varint(message, at)
            if key >> 3 == number:
                return message[at : at + size]
            at += size
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {kind}")
    return None


class FrameSealer:
    """Protects the frames a caller writes (Frame.sealed / Frame.signed in the proto)."""

    def __init__(self, protection: int, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.protection = protection
        self.cipher = AESGCM(key)
        self.sent = 0

    def seal(self, frame: bytes) -> bytes:
        nonce = b"\0" * 4 + struct.pack("<Q", self.sent)
        self.sent += 1
        if self.protection == pb.PROTECTION_AEAD:
            return (
                b"\x52"
                + _varint(len(frame) + TAG_BYTES)
                + self.cipher.encrypt(nonce, frame, None)
            )
        tag = self.cipher.encrypt(nonce, b"", frame)
        return b"\x5a" + _varint(len(frame) + TAG_BYTES) + frame + tag


class Link:
    """One Exchange stream, opened with `first` (a Hello) in its metadata; raw messages in,
    parsed Frames (or the status) out."""

    def __init__(
        self,
        target: str,
        first: pb.Hello | bytes | None = None,
        channel_options: Sequence[tuple[str, int | str]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 30,
    ) -> None:
        options = list(channel_options)
        if credentials is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            self.channel = grpc.secure_channel(target, credentials, options=options)
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self.hello = first if isinstance(first, pb.Hello) else None
        metadata = []
        if first is not None:
            raw = first.SerializeToString() if isinstance(first, pb.Hello) else first
            metadata.append((HELLO_KEY, raw))
        call = self.channel.stream_stream(EXCHANGE)
        self.responses = call(
            iter(self._outbox.get, None), metadata=metadata, timeout=timeout
        )
        self.sealer: FrameSealer | None = None

    def welcome(self) -> pb.Welcome | None:
        """The server's Welcome, or None when it refused (the status says why)."""
        try:
            metadata = self.responses.initial_metadata()
        except grpc.RpcError:
            return None
        for key, value in metadata or ():
            if key == WELCOME_KEY:
                return pb.Welcome.FromString(value)
        return None

    def send(self, message: bytes) -> None:
        """Writes `message` as it is: protected or not, as the caller chooses."""
        self._outbox.put(message)

    def send_frame(self, frame: pb.Frame) -> None:
        """Writes `frame`, protected as the link's handshake agreed."""
        raw = frame.SerializeToString()
        self.send(self.sealer.seal(raw) if self.sealer else raw)

    def reply_bytes(self) -> bytes:
        return next(self.responses)

    def reply(self) -> pb.Frame:
        return pb.Frame.FromString(self.reply_bytes())

    def close(self) -> None:
        """Drops the stream at once: the server may see it end or see it cancelled."""
        self._outbox.put(None)
        self.channel.close()

    def end(self, timeout: float = 10) -> tuple[grpc.StatusCode, str]:
        """Ends the stream as a rank does: a half-close, then the server's status, then the
        channel. Unlike `close`, the server always sees a clean end, never a cancellation."""
        self._outbox.put(None)
        done = threading.Event()
        outcome: list[tuple[grpc.StatusCode, str]] = []

        def wait_for_status() -> None:
            outcome.append(self.status())
            done.set()

        threading.Thread(target=wait_for_status, daemon=True).start()
        done.wait(timeout)
        self.channel.close()
        return outcome[0] if outcome else (grpc.StatusCode.DEADLINE_EXCEEDED, "")

    def status(self) -> tuple[grpc.StatusCode, str]:
        """Waits for the stream's end; its code and details."""
        try:
            for _ in self.responses:
                pass
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""


class ServerProofError(PermissionError):
    """The server could not prove that it holds the caller's token."""

    def __init__(self, target: str, server_proof: bytes) -> None:
        super().__init__(
            f"{target} could not prove that it holds this side's token "
            "(TORCH_GRPC_PG_AUTH_TOKEN): the tokens differ, or it is not a rank"
        )
        self.server_proof = server_proof


class StatusRefused(PermissionError):
    """The server refused an observer; `details` says as much as it told."""

    def __init__(self, target: str, details: str) -> None:
        super().__init__(f"{target} refused the status request: {details}")
        self.details = details


def handshake(
    target: str,
    group: str,
    src: int,
    dst: int,
    world: int,
    token: str,
    *,
    check_server: bool = True,
    credentials: grpc.ChannelCredentials | None = None,
    channel_options: Sequence[tuple[str, int | str]] = (),
    link_kind: int | None = None,
    protection: int | None = None,
    timeout: float = 30,
) -> tuple[Link, pb.Welcome | None]:
    """Runs the caller's side with `token`: the link and the server's Welcome (None when it
    refused: `link.status()` says why).

    Like the ranks, it checks the server's proof before it writes a frame, and then seals
    what `send_frame` writes with the link's key. (Tests that play an attacker skip the
    check: an attacker would.)"""
    if link_kind is None:
        link_kind = (
            pb.LINK_KIND_UNIX if target.startswith("unix:") else pb.LINK_KIND_TCP
        )
    first = hello(group, src, dst, world, token, link=link_kind, protection=protection)
    link = Link(
        target,
        first,
        channel_options=channel_options,
        credentials=credentials,
        timeout=timeout,
    )
    welcome = link.welcome()
    if welcome is None:
        return link, None
    if check_server and not hmac.compare_digest(
        server_proof(token, first, welcome.nonce), welcome.proof
    ):
        link.close()
        raise ServerProofError(target, welcome.proof)
    if token and first.protection != pb.PROTECTION_NONE:
        caller_key, _ = link_keys(token, first, welcome.nonce)
        link.sealer = FrameSealer(first.protection, caller_key)
    return link, welcome


def data_frame(
    seq: int,
    op: int,
    dtype: int,
    count: int,
    payload: bytes,
    offset: int = 0,
    src: int = 1,
    reduction: int = 0,
    kind: int = pb.FRAME_KIND_DATA,
    error: bytes = b"",
) -> pb.Frame:
    return pb.Frame(
        header=pb.FrameHeader(
            kind=kind,
            seq=seq,
            op=op,
            dtype=dtype,
            count=count,
            offset=offset,
            src_rank=src,
            reduction=reduction,
            error=error,
        ),
        payload=payload,
    )


def read_status(
    target: str,
    token: str = "",
    credentials: grpc.ChannelCredentials | None = None,
    channel_options: Sequence[tuple[str, int | str]] = (),
    timeout: float = 30,
) -> pb.StatusReply:
    """One rank's StatusReply, read as an authenticated observer. With a token, the reply's
    MAC is checked with the key of this very handshake, so a relay cannot alter it."""
    link, welcome = handshake(
        target,
        "",
        OBSERVER_RANK,
        0,
        0,
        token,
        credentials=credentials,
        channel_options=channel_options,
        timeout=timeout,
    )
    try:
        if welcome is None:
            try:
                link.reply_bytes()
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise StatusRefused(target, exc.details() or "") from None
                raise
            raise StatusRefused(target, "it sent no Welcome")
        raw = link.reply_bytes()
        frame = pb.Frame.FromString(raw)
        if token:
            _, server_key = link_keys(token, link.hello, welcome.nonce)
            status = field_bytes(raw, 7) or b""
            if not hmac.compare_digest(_mac(server_key, status), frame.status_mac):
                raise ServerProofError(target, b"")
        return frame.status
    finally:
        link.close()
