"""The wire protocol from the outside: a client built from protos/ with grpcio gets clear
refusals, and a Python implementation of the handshake and the frame protection, written from
the proto alone, interoperates with the ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, backend_under_test, init_groups, run_ranks

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="the grpc backend's own protocol"
)


def _probe_own_server(ctx: RankContext) -> dict[str, str]:
    import wire_client as wc

    init_groups(ctx)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    replies: dict[str, str] = {}
    if ctx.rank == 0:

        def refusal(first: wc.pb.Hello | bytes | None) -> str:
            link = wc.Link(backend.tcp_address, first)
            link.send(wc.data_frame(1, 1, 1, 1, b"\0\0\0\0").SerializeToString())
            welcomed = link.welcome() is not None
            code, details = link.status()
            link.close()
            assert not welcomed and code.name == "PERMISSION_DENIED", (code, details)
            return details

        bad_version = wc.hello(backend.group_key, 1, 0, 2)
        bad_version.protocol_version = 99
        replies["version"] = refusal(bad_version)
        replies["group"] = refusal(wc.hello("no-such-group", 1, 0, 2))
        replies["ranks"] = refusal(wc.hello(backend.group_key, 1, 1, 2))
        replies["nonce"] = refusal(wc.hello(backend.group_key, 1, 0, 2, nonce=b"short"))
        replies["link"] = refusal(
            wc.hello(backend.group_key, 1, 0, 2, link=wc.pb.LINK_KIND_UNIX)
        )
        # A call with no Hello, and metadata that is no Hello at all.
        replies["no_hello"] = refusal(None)
        replies["garbage"] = refusal(b"\xff" * 64)
    # Keep rank 1 (and its server) alive until rank 0 is done probing.
    dist.barrier()
    return replies


def test_handshake_refusals_say_what_is_wrong() -> None:
    replies = run_ranks(_probe_own_server, 2)[0].value
    assert "protocol version 99" in replies["version"], replies
    assert "same torch-grpc-pg release" in replies["version"], replies
    assert "no process group 'no-such-group'" in replies["group"], replies
    assert "stale addresses" in replies["ranks"], replies
    assert "nonce has 5 bytes" in replies["nonce"], replies
    assert (
        "dialled this rank's unix socket, but the call came over TCP" in replies["link"]
    )
    assert "carries no Hello" in replies["no_hello"], replies
    assert "not a valid message" in replies["garbage"], replies


TOKEN = "the-real-token"
NUMEL = 1000
OP_POINT_TO_POINT, FLOAT32 = 11, 1


def _python_sender(ctx: RankContext, encrypt: bool) -> dict[str, object]:
    """Rank 1 is played from Python (tests/wire_client.py, torch_grpc_pg/wire.py): it
    proves the token, derives the link's key and seals or signs its messages as the proto
    says. Rank 0, a real rank, receives them."""
    import wire_client as wc

    import torch_grpc_pg

    store = dist.PrefixStore("python", ctx.store())
    values = torch.arange(NUMEL, dtype=torch.float32)
    if ctx.rank == 0:
        pg = torch_grpc_pg.ProcessGroupGrpc(
            store,
            0,
            2,
            torch.distributed.default_pg_timeout,
            "python",
            **torch_grpc_pg.Options(
                auth_token=TOKEN, encrypt=encrypt, unix_sockets=False
            ).as_kwargs(),
        )
        received = [torch.zeros(NUMEL) for _ in range(3)]
        for tensor in received:
            pg.recv([tensor], 1, 0).wait()
        store.set("received", "1")
        return {
            "exact": all(
                torch.equal(t, values * (i + 1)) for i, t in enumerate(received)
            )
        }
    rank = wc.PythonRank(store, 1, 2, "python", token=TOKEN)
    rank.join()
    link, welcome = wc.handshake(
        rank.target(0, unix=False),
        rank.group_key + "/p2p",
        1,
        0,
        2,
        TOKEN,
        protection=wc.pb.PROTECTION_AEAD if encrypt else wc.pb.PROTECTION_MAC,
    )
    assert welcome is not None, link.status()
    for i in range(3):
        payload = (values * (i + 1)).numpy().tobytes()
        link.send_frame(
            wc.data_frame(i + 1, OP_POINT_TO_POINT, FLOAT32, NUMEL, payload)
        )
    store.wait(["received"])
    sealed = link.sealer is not None and link.sealer.sent == 3
    link.close()
    rank.leave()
    return {"sealed": sealed}


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "authenticated"])
def test_frames_protected_from_the_proto_alone_are_received(encrypt: bool) -> None:
    receiver, sender = (r.value for r in run_ranks(_python_sender, 2, encrypt))
    assert sender["sealed"], sender
    assert receiver["exact"], receiver
