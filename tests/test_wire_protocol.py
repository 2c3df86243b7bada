"""The wire protocol from the outside: a client built from protos/ with grpcio gets clear refusals."""

from __future__ import annotations

import grpc
import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, backend_under_test, init_groups, run_ranks

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="the grpc backend's own protocol"
)


def _probe_own_server(ctx: RankContext) -> dict[str, str]:
    from torch_grpc_pg._proto import torch_grpc_pg_pb2 as pb
    from torch_grpc_pg._proto import torch_grpc_pg_pb2_grpc as pb_grpc

    init_groups(ctx)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    replies: dict[str, str] = {}
    if ctx.rank == 0:
        with grpc.insecure_channel(backend.tcp_address) as channel:
            stub = pb_grpc.ProcessGroupServiceStub(channel)

            def refusal(**fields: object) -> str:
                request = {
                    "protocol_version": 1,
                    "group_key": "?",
                    "src_rank": 1,
                    "dst_rank": 0,
                    "world_size": 2,
                }
                request.update(fields)
                reply = stub.Handshake(pb.HandshakeRequest(**request), timeout=10)
                assert not reply.ok, fields
                return reply.error

            replies["version"] = refusal(protocol_version=99)
            replies["group"] = refusal(group_key="no-such-group")
    # Keep rank 1 (and its server) alive until rank 0 is done probing.
    dist.barrier()
    return replies


def test_handshake_refusals_say_what_is_wrong() -> None:
    replies = run_ranks(_probe_own_server, 2)[0].value
    assert "protocol version 99" in replies["version"], replies
    assert "same torch-grpc-pg release" in replies["version"], replies
    assert "no process group 'no-such-group'" in replies["group"], replies
