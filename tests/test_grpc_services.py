"""gRPC's own services on a rank's server: Health and reflection, and who may call them.

Without a token both are open; a token closes both (they cannot run the token
handshake), except Health when TORCH_GRPC_PG_HEALTH_PUBLIC=1 opens it to probes;
mutual TLS opens both to holders of a certificate from the job's CA.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import torch.distributed as dist
from test_security import _make_pki

from dist_harness import RankContext, backend_under_test, init_default_group, run_ranks

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="calls the grpc backend's server"
)

SERVING = 1
SERVICE = b"torch_grpc_pg.ProcessGroupService"
# ServerReflectionRequest with list_services (field 7) = "*".
LIST_SERVICES = b"\x3a\x01*"


def _call(channel: grpc.Channel, method: str, request: bytes) -> tuple[str, bytes]:
    """(status code name, reply bytes) of a unary or one-message streaming call."""
    try:
        if "Reflection" in method:
            call = channel.stream_stream(
                method,
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            reply = next(iter(call(iter([request]), timeout=10)))
        else:
            call = channel.unary_unary(
                method,
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            reply = call(request, timeout=10)
        return "OK", reply
    except grpc.RpcError as exc:
        return exc.code().name, b""


def _probe(ctx: RankContext, env: dict[str, str]) -> dict[str, Any]:
    os.environ.update(env)
    init_default_group(ctx)
    address = dist.group.WORLD._get_backend(torch.device("cpu")).tcp_address
    if env.get("TORCH_GRPC_PG_TLS_CA"):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(env["TORCH_GRPC_PG_TLS_CA"]).read_bytes(),
            private_key=Path(env["TORCH_GRPC_PG_TLS_KEY"]).read_bytes(),
            certificate_chain=Path(env["TORCH_GRPC_PG_TLS_CERT"]).read_bytes(),
        )
        channel = grpc.secure_channel(address, credentials)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        health = _call(channel, "/grpc.health.v1.Health/Check", b"")
        reflection = _call(
            channel,
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            LIST_SERVICES,
        )
    dist.destroy_process_group()
    return {
        # HealthCheckResponse: field 1 (status), a varint.
        "health": (health[0], health[1][1] if health[1][:1] == b"\x08" else 0),
        "reflection": (reflection[0], SERVICE in reflection[1]),
    }


def _seen(env: dict[str, str]) -> dict[str, Any]:
    (result,) = run_ranks(_probe, 1, env, timeout_s=120)
    return result.value


def test_without_a_token_health_and_reflection_are_open() -> None:
    seen = _seen({})
    assert seen["health"] == ("OK", SERVING), seen
    assert seen["reflection"] == ("OK", True), seen


def test_a_token_closes_health_and_reflection() -> None:
    seen = _seen({"TORCH_GRPC_PG_AUTH_TOKEN": "s3cret"})
    assert seen["health"][0] == "UNIMPLEMENTED", seen
    assert seen["reflection"][0] == "UNIMPLEMENTED", seen


def test_health_public_opens_health_only() -> None:
    seen = _seen(
        {"TORCH_GRPC_PG_AUTH_TOKEN": "s3cret", "TORCH_GRPC_PG_HEALTH_PUBLIC": "1"}
    )
    assert seen["health"] == ("OK", SERVING), seen
    assert seen["reflection"][0] == "UNIMPLEMENTED", seen


def test_mutual_tls_opens_both_to_certificate_holders(tmp_path: Path) -> None:
    seen = _seen(_make_pki(tmp_path) | {"TORCH_GRPC_PG_AUTH_TOKEN": "s3cret"})
    assert seen["health"] == ("OK", SERVING), seen
    assert seen["reflection"] == ("OK", True), seen
