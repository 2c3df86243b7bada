"""The link handshake of protos/torch_grpc_pg.proto in Python, from the proto alone.

The status tool uses it as an observer; tests use it to play strangers, replayers and
planted servers. It speaks Hello, Challenge, Proof and Welcome with the HMAC transcript
that the proto describes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import struct
from collections.abc import Sequence

import grpc

from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb

EXCHANGE = "/torch_grpc_pg.ProcessGroupService/Exchange"
PROTOCOL_VERSION = pb.PROTOCOL_VERSION_CURRENT
NONCE_BYTES = 32
OBSERVER_RANK = 0xFFFFFFFF  # what a monitoring tool claims in its Hello


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def proof(
    token: str,
    role: str,
    group: str,
    src: int,
    dst: int,
    world: int,
    caller_nonce: bytes,
    server_nonce: bytes,
) -> bytes:
    """The MAC that proves the token for one side of one handshake; empty without a token."""
    if not token:
        return b""
    message = (
        _field(b"torch-grpc-pg link v2")
        + _field(role.encode())
        + _field(group.encode())
        + struct.pack("<III", src, dst, world)
        + _field(caller_nonce)
        + _field(server_nonce)
    )
    return hmac.new(token.encode(), message, hashlib.sha256).digest()


class Link:
    """One Exchange stream; raw messages in, parsed Frames (or the status) out."""

    def __init__(
        self,
        target: str,
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
        call = self.channel.stream_stream(
            EXCHANGE,
            request_serializer=lambda b: b,
            response_deserializer=pb.Frame.FromString,
        )
        self.responses = call(iter(self._outbox.get, None), timeout=timeout)

    def send(self, message: bytes) -> None:
        self._outbox.put(message)

    def send_frame(self, frame: pb.Frame) -> None:
        self.send(frame.SerializeToString())

    def reply(self) -> pb.Frame:
        return next(self.responses)

    def close(self) -> None:
        self._outbox.put(None)
        self.channel.close()

    def status(self) -> tuple[grpc.StatusCode, str]:
        """Waits for the stream's end; its code and details."""
        try:
            for _ in self.responses:
                pass
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""


def group_settings(chunk_bytes: int = 2 << 20, direct_max_bytes: int = 64 << 10) -> str:
    """The Hello's `settings`, as the ranks write them (csrc/backend/bindings.cc)."""
    return f"chunk_bytes={chunk_bytes} direct_max_bytes={direct_max_bytes}"


def hello(
    group: str,
    src: int,
    dst: int,
    world: int,
    nonce: bytes | None = None,
    settings: str | None = None,
) -> pb.Frame:
    if settings is None:
        settings = "" if src == OBSERVER_RANK else group_settings()
    return pb.Frame(
        hello=pb.Hello(
            protocol_version=PROTOCOL_VERSION,
            group_key=group,
            src_rank=src,
            dst_rank=dst,
            world_size=world,
            nonce=nonce if nonce is not None else os.urandom(NONCE_BYTES),
            settings=settings,
        )
    )


class ServerProofError(PermissionError):
    """The server could not prove that it holds the caller's token; it got no proof back."""

    def __init__(self, target: str, server_proof: bytes) -> None:
        super().__init__(
            f"{target} could not prove that it holds this side's token "
            "(TORCH_GRPC_PG_AUTH_TOKEN): the tokens differ, or it is not a rank"
        )
        self.server_proof = server_proof


class StatusRefused(PermissionError):
    """The server refused an observer; `before_proof` when it did so at the Challenge."""

    def __init__(self, target: str, reason: str, before_proof: bool) -> None:
        super().__init__(f"{target} refused the status request: {reason}")
        self.before_proof = before_proof


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
    link: Link | None = None,
) -> tuple[Link, pb.Frame]:
    """Runs the caller's side with `token`; returns the link and the server's last reply.

    Like the ranks, it checks the server's proof before it sends its own, so a server that
    cannot prove it holds the token gets nothing it could replay. (Tests that play an
    attacker skip that check: an attacker would.) `link` is an already opened one, for
    callers that need their own channel options."""
    link = link or Link(target, credentials=credentials)
    first = hello(group, src, dst, world)
    link.send_frame(first)
    challenge = link.reply().challenge
    if challenge.error:
        return link, pb.Frame(challenge=challenge)
    nonces = (first.hello.nonce, challenge.nonce)
    expected = proof(token, "server", group, src, dst, world, *nonces)
    if check_server and not hmac.compare_digest(expected, challenge.proof):
        link.close()
        raise ServerProofError(target, challenge.proof)
    mine = proof(token, "client", group, src, dst, world, *nonces)
    link.send_frame(pb.Frame(proof=pb.Proof(proof=mine)))
    return link, link.reply()


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
    link: Link | None = None,
) -> pb.StatusReply:
    """One rank's StatusReply, read as an authenticated observer."""
    link, last = handshake(
        target, "", OBSERVER_RANK, 0, 0, token, credentials=credentials, link=link
    )
    try:
        if last.HasField("challenge"):
            raise StatusRefused(target, last.challenge.error, before_proof=True)
        if last.welcome.error:
            raise StatusRefused(target, last.welcome.error, before_proof=False)
        return link.reply().status
    finally:
        link.close()
