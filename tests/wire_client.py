"""Test-side pieces of the wire protocol: the package's client, a server an attacker planted,
and a rank played from Python."""

from __future__ import annotations

import hmac
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import timedelta

import grpc
import torch.distributed as dist

from torch_grpc_pg.wire import (  # noqa: F401 - re-exported for the tests
    EXCHANGE,
    HELLO_KEY,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    WELCOME_KEY,
    Link,
    caller_proof,
    data_frame,
    group_settings,
    handshake,
    hello,
    pb,
    server_proof,
)

# Where a rank's rendezvous keeps its keys (csrc/backend/group_instance.h).
RENDEZVOUS = "torch_grpc_pg/"


Handler = Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]


class StoreWithPlantedEndpoint(dist.Store):
    """A rank's view of a store in which an attacker has replaced one rank's address
    with its own: what anyone who can write the store achieves by overwriting the key
    as soon as the rank publishes it. Everything else goes to ``inner``."""

    def __init__(self, inner: dist.Store, rank: int, endpoint: str) -> None:
        super().__init__()
        self.inner, self.suffix, self.endpoint = inner, f"/endpoint/{rank}", endpoint

    def get(self, key: str) -> bytes:
        if key.startswith(RENDEZVOUS) and key.endswith(self.suffix):
            self.inner.wait([key])
            return self.endpoint.encode()
        return self.inner.get(key)

    def set(self, key: str, value: str | bytes) -> None:
        self.inner.set(key, value)

    def add(self, key: str, value: int) -> int:
        return self.inner.add(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)


def join_group_instance(store: dist.Store, rank: int, world: int) -> str:
    """The name of the group instance ``rank`` joins, as csrc/backend/group_instance.h
    hands it out: rank 0 opens one under a fresh name and answers each peer's fresh
    nonce with it. The store keeps the instance's keys under RENDEZVOUS + name + "/"."""
    if rank != 0:
        nonce = os.urandom(16).hex()
        store.set(f"{RENDEZVOUS}hello/{rank}", nonce)
        welcome = f"{RENDEZVOUS}welcome/{rank}/{nonce}"
        store.wait([welcome])
        name = store.get(welcome).decode()
        store.set(f"{RENDEZVOUS}{name}/joined/{rank}", "1")
        return name
    name = os.urandom(16).hex()
    store.wait([f"{RENDEZVOUS}hello/{r}" for r in range(1, world)])
    answered: set[tuple[int, str]] = set()
    pending = set(range(1, world))
    while pending:
        for r in sorted(pending):
            nonce = store.get(f"{RENDEZVOUS}hello/{r}").decode()
            if (r, nonce) not in answered:
                store.set(f"{RENDEZVOUS}welcome/{r}/{nonce}", name)
                answered.add((r, nonce))
            if store.check([f"{RENDEZVOUS}{name}/joined/{r}"]):
                pending.discard(r)
        if pending:
            time.sleep(0.001)  # a hello left by an earlier instance: read it again
    return name


def _exchange_server(handle: Handler) -> tuple[grpc.Server, int]:
    """A grpcio server of the Exchange method on loopback: raw bytes in and out."""
    handler = grpc.stream_stream_rpc_method_handler(handle)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service, method = EXCHANGE.strip("/").rsplit("/", 1)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _hello_of(context: grpc.ServicerContext) -> pb.Hello | None:
    for key, value in context.invocation_metadata():
        if key == HELLO_KEY:
            return pb.Hello.FromString(value)
    return None


@dataclass
class PlantedServer:
    """A server an attacker put into the store: it records the Hellos and the messages
    callers send it, and answers with a Welcome whose proof is a guess."""

    token_guess: str = ""
    hellos: list[pb.Hello] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> int:
        self.server, port = _exchange_server(self._exchange)
        return port

    def stop(self) -> None:
        self.server.stop(0)

    def _exchange(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        caller = _hello_of(context)
        if caller is not None:
            with self.lock:
                self.hellos.append(caller)
            nonce = os.urandom(NONCE_BYTES)
            forged = server_proof(self.token_guess, caller, nonce) or os.urandom(32)
            welcome = pb.Welcome(nonce=nonce, proof=forged)
            context.send_initial_metadata(((WELCOME_KEY, welcome.SerializeToString()),))
        for message in requests:
            with self.lock:
                self.messages.append(message)
        yield from ()


class PythonRank:
    """Rank `rank` of a process group whose other ranks are real, played from Python.

    It joins the group's rendezvous in the store as a rank does, serves the real ranks'
    streams (checking their proofs, and reading and dropping what they send), and opens its
    own streams to them on demand, on which the test writes what it likes. The real ranks
    see a peer that holds the token and speaks the protocol; what it then sends is the
    test's to choose."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world: int,
        group_name: str,
        token: str = "",
        settings: str | None = None,
    ) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.group_name, self.token = group_name, token
        self.settings = group_settings() if settings is None else settings
        self.endpoints: list[str] = []
        self.group_key = ""
        self.received: list[bytes] = []

    def join(self) -> None:
        """The rendezvous, as ProcessGroupGrpc::rendezvous runs it; returns once every rank
        has reported."""
        instance = join_group_instance(self.store, self.rank, self.world)
        prefix = f"{RENDEZVOUS}{instance}/"
        self.group_key = f"{self.group_name}#{instance}"
        self.server, port = _exchange_server(self._serve)
        peer = 0 if self.rank != 0 else 1
        machine = self.store.get(prefix + f"endpoint/{peer}").decode().split("\n")[1]
        # No unix socket of its own: the real ranks dial it over TCP.
        self.store.set(
            prefix + f"endpoint/{self.rank}", f"v1\n{machine}\n127.0.0.1:{port}\n"
        )
        self.endpoints = [
            self.store.get(prefix + f"endpoint/{r}").decode() for r in range(self.world)
        ]
        # It maps no shared segment: as rank 0 it offers none, otherwise it declines
        # the real rank 0's, so that every rank goes on through the links.
        if self.rank == 0:
            self.store.set(prefix + "segment", "none")
        self.store.set(prefix + f"segment/{self.rank}", "played from Python")
        self.store.set(prefix + f"outcome/{self.rank}", "ok")
        self.store.wait([prefix + f"outcome/{r}" for r in range(self.world)])

    def target(self, dst: int, unix: bool = True) -> str:
        _, _, tcp, unix_path = self.endpoints[dst].split("\n")
        return f"unix:{unix_path}" if unix and unix_path else tcp

    def open(self, dst: int, p2p: bool = False, unix: bool = True) -> Link:
        """This rank's stream to `dst` (its point-to-point one with `p2p`), handshaken."""
        key = self.group_key + ("/p2p" if p2p else "")
        link, welcome = handshake(
            self.target(dst, unix), key, self.rank, dst, self.world, self.token
        )
        if welcome is None:
            raise PermissionError(f"rank {dst} refused: {link.status()}")
        return link

    def leave(self) -> None:
        self.server.stop(0)

    def _serve(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        caller = _hello_of(context)
        if caller is None or not hmac.compare_digest(
            caller_proof(self.token, caller), caller.proof
        ):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "refused")
        nonce = os.urandom(NONCE_BYTES)
        welcome = pb.Welcome(nonce=nonce, proof=server_proof(self.token, caller, nonce))
        context.send_initial_metadata(((WELCOME_KEY, welcome.SerializeToString()),))
        for message in requests:
            self.received.append(message)
        yield from ()
