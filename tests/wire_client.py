"""A client and a server of the wire protocol written from protos/ alone, as an attacker would.

They speak the link handshake (Hello, Challenge, Proof, Welcome) in Python, with the HMAC
transcript that protos/torch_grpc_pg.proto describes, so tests can play a stranger with or
without the token, a replayer, or a server planted in the store.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import struct
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb

EXCHANGE = "/torch_grpc_pg.ProcessGroupService/Exchange"
PROTOCOL_VERSION = 2
NONCE_BYTES = 32


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
        self, target: str, channel_options: list[tuple[str, int]] | None = None
    ) -> None:
        self.channel = grpc.insecure_channel(target, options=channel_options or [])
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        call = self.channel.stream_stream(
            EXCHANGE,
            request_serializer=lambda b: b,
            response_deserializer=pb.Frame.FromString,
        )
        self.responses = call(iter(self._outbox.get, None), timeout=30)

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


def hello(
    group: str, src: int, dst: int, world: int, nonce: bytes | None = None
) -> pb.Frame:
    return pb.Frame(
        hello=pb.Hello(
            protocol_version=PROTOCOL_VERSION,
            group_key=group,
            src_rank=src,
            dst_rank=dst,
            world_size=world,
            nonce=nonce if nonce is not None else os.urandom(NONCE_BYTES),
        )
    )


def handshake(
    target: str, group: str, src: int, dst: int, world: int, token: str
) -> tuple[Link, pb.Frame]:
    """Runs the caller's side with `token`; returns the link and the server's last reply."""
    link = Link(target)
    first = hello(group, src, dst, world)
    link.send_frame(first)
    challenge = link.reply().challenge
    if challenge.error:
        return link, pb.Frame(challenge=challenge)
    mine = proof(
        token, "client", group, src, dst, world, first.hello.nonce, challenge.nonce
    )
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
    error: str = "",
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


@dataclass
class PlantedServer:
    """A server an attacker put into the store: it records what callers send it."""

    token_guess: str = ""
    received: list[pb.Frame] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> int:
        handler = grpc.stream_stream_rpc_method_handler(
            self._exchange,
            request_deserializer=pb.Frame.FromString,
            response_serializer=pb.Frame.SerializeToString,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "torch_grpc_pg.ProcessGroupService", {"Exchange": handler}
                ),
            )
        )
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return port

    def stop(self) -> None:
        self.server.stop(0)

    def _exchange(
        self, requests: Iterator[pb.Frame], context: grpc.ServicerContext
    ) -> Iterator[pb.Frame]:
        for message in requests:
            with self.lock:
                self.received.append(message)
            if message.HasField("hello"):
                h = message.hello
                nonce = os.urandom(NONCE_BYTES)
                forged = proof(
                    self.token_guess,
                    "server",
                    h.group_key,
                    h.src_rank,
                    h.dst_rank,
                    h.world_size,
                    h.nonce,
                    nonce,
                ) or os.urandom(32)
                yield pb.Frame(challenge=pb.Challenge(nonce=nonce, proof=forged))
            elif message.HasField("proof"):
                yield pb.Frame(welcome=pb.Welcome())
