"""A man in the middle, built with grpcio: it relays Exchange streams to a rank, handshake
included, and may alter what the caller sends once it carries data.

It stands where an attacker who can write to the c10d store puts one: the store names it as a
rank's address, callers dial it, and it dials the real rank. It forwards every message and
every piece of metadata in both directions unchanged, so that whatever the two ranks prove to
each other they prove through it; then `tamper` decides the fate of each message the caller
sends that is large enough to carry a payload, or, with `transplant`, a message is moved from
the call that carried it into another call (another of the caller's connections).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from torch_grpc_pg.wire import EXCHANGE

# Handshake messages and small frames stay under this; a data frame of 1000 floats is over.
PAYLOAD_BEARING_BYTES = 1000

# What becomes of one payload-bearing message: the messages to send in its place.
Tamper = Callable[[bytes], list[bytes]]


def flip_last_byte(message: bytes) -> list[bytes]:
    """The message with one bit of its last byte flipped: payload data (or a frame's tag)."""
    return [message[:-1] + bytes([message[-1] ^ 0x01])]


def drop(message: bytes) -> list[bytes]:
    return []


def replay(message: bytes) -> list[bytes]:
    return [message, message]


def _reserved(key: str) -> bool:
    # grpcio sets these itself; forwarding them would be refused.
    return key.startswith(("grpc-", ":")) or key in ("user-agent", "content-type", "te")


@dataclass
class Relay:
    """Relays every Exchange call it gets to `upstream`, tampering with the first
    `tamper_count` payload-bearing messages callers send."""

    upstream: str
    tamper: Tamper | None
    tamper_count: int = 1
    # Instead of `tamper`: take the first payload-bearing message out of its
    # call and send it ahead of the next one that another call carries.
    transplant: bool = False
    tampered: int = 0
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    held: tuple[int, bytes] | None = None  # (call, message) taken by a transplant

    @classmethod
    def for_attack(cls, name: str, upstream: str) -> Relay:
        """`name`: one of the tampers above, or "transplant"."""
        if name == "transplant":
            return cls(upstream, None, transplant=True)
        return cls(upstream, globals()[name])

    def start(self) -> int:
        handler = grpc.stream_stream_rpc_method_handler(self._exchange)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        service, method = EXCHANGE.rsplit("/", 1)
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    service.strip("/"), {method: handler}
                ),
            )
        )
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel = grpc.insecure_channel(
            self.upstream,
            options=[
                ("grpc.max_send_message_length", -1),
                ("grpc.max_receive_message_length", -1),
            ],
        )
        self.server.start()
        return port

    def stop(self) -> None:
        self.server.stop(0)
        self.channel.close()

    def _fate(self, message: bytes, call: int) -> list[bytes]:
        if len(message) < PAYLOAD_BEARING_BYTES:
            return [message]
        with self.lock:
            if self.tampered >= self.tamper_count:
                return [message]
            if self.transplant:
                if self.held is None:
                    self.held = (call, message)
                    return []
                if self.held[0] == call:
                    return [message]
                self.tampered += 1
                return [self.held[1], message]
            self.tampered += 1
        assert self.tamper is not None
        return self.tamper(message)

    def _exchange(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        with self.lock:
            self.calls += 1
            call_index = self.calls
        outbox: queue.Queue[bytes | None] = queue.Queue()

        def pump() -> None:
            try:
                for message in requests:
                    for out in self._fate(message, call_index):
                        outbox.put(out)
            except grpc.RpcError:
                pass
            outbox.put(None)

        threading.Thread(target=pump, daemon=True).start()
        metadata = [
            (k, v) for k, v in context.invocation_metadata() if not _reserved(k)
        ]
        call = self.channel.stream_stream(EXCHANGE)(
            iter(outbox.get, None), metadata=metadata, wait_for_ready=True
        )
        try:
            context.send_initial_metadata(
                [(k, v) for k, v in call.initial_metadata() if not _reserved(k)]
            )
            yield from call
        except grpc.RpcError as error:
            context.abort(error.code(), error.details() or "")
