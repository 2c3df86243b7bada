"""Test-side pieces of the wire protocol: the package's client, and a server an attacker planted."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from torch_grpc_pg.wire import (  # noqa: F401 - re-exported for the tests
    EXCHANGE,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    Link,
    data_frame,
    handshake,
    hello,
    pb,
    proof,
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
