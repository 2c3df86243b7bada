"""The wire protocol from the outside: a client built from protos/ with grpcio gets clear refusals."""

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

        def refusal(frame: wc.pb.Frame) -> str:
            link = wc.Link(backend.tcp_address)
            link.send_frame(frame)
            reply = link.reply()
            code, details = link.status()
            link.close()
            assert code.name == "PERMISSION_DENIED", (code, details)
            return reply.challenge.error

        def raw_refusal(message: bytes) -> str:
            link = wc.Link(backend.tcp_address)
            link.send(message)
            code, details = link.status()
            link.close()
            return f"{code.name}: {details}"

        bad_version = wc.hello(backend.group_key, 1, 0, 2)
        bad_version.hello.protocol_version = 99
        replies["version"] = refusal(bad_version)
        replies["group"] = refusal(wc.hello("no-such-group", 1, 0, 2))
        replies["ranks"] = refusal(wc.hello(backend.group_key, 1, 1, 2))
        replies["nonce"] = refusal(wc.hello(backend.group_key, 1, 0, 2, nonce=b"short"))
        # A data frame where a Hello belongs, and bytes that are no message at all.
        replies["frame_first"] = raw_refusal(
            wc.data_frame(1, 1, 1, 1, b"\0\0\0\0").SerializeToString()
        )
        replies["garbage"] = raw_refusal(b"\xff" * 64)
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
    assert replies["frame_first"].startswith(
        "INVALID_ARGUMENT: expected a handshake Hello"
    ), replies
    assert replies["garbage"].startswith("INVALID_ARGUMENT: handshake Hello"), replies
