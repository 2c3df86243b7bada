"""Options: every field follows its environment variable, and bad values name that variable."""

from __future__ import annotations

from datetime import timedelta

import pytest

torch_grpc_pg = pytest.importorskip("torch_grpc_pg")
Options = torch_grpc_pg.Options


def test_fields_default_to_their_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_GRPC_PG_PORT", "4567")
    monkeypatch.setenv("TORCH_GRPC_PG_UNIX_SOCKETS", "0")
    monkeypatch.setenv("TORCH_GRPC_PG_CHUNK_BYTES", "65536")
    monkeypatch.setenv("TORCH_GRPC_PG_AUTH_TOKEN", "t")
    monkeypatch.setenv("TORCH_GRPC_PG_CONNECT_TIMEOUT", "5")
    options = Options()
    assert (
        options.port,
        options.unix_sockets,
        options.chunk_bytes,
        options.auth_token,
    ) == (4567, False, 65536, "t")
    assert options.connect_timeout == timedelta(seconds=5)


def test_explicit_fields_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_GRPC_PG_PORT", "4567")
    assert Options(port=0).port == 0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TORCH_GRPC_PG_PORT", "http", "TORCH_GRPC_PG_PORT='http' is not an integer"),
        (
            "TORCH_GRPC_PG_UNIX_SOCKETS",
            "maybe",
            "TORCH_GRPC_PG_UNIX_SOCKETS='maybe' is not a boolean",
        ),
    ],
)
def test_unparsable_variables_are_named(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message):
        Options()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"port": 70000}, "TORCH_GRPC_PG_PORT"),
        ({"chunk_bytes": 10}, "TORCH_GRPC_PG_CHUNK_BYTES"),
        ({"max_queued_frames": 0}, "TORCH_GRPC_PG_MAX_QUEUED_FRAMES"),
        ({"tls_cert": "a.pem"}, "TORCH_GRPC_PG_TLS_KEY"),
    ],
)
def test_invalid_values_are_refused_before_anything_starts(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Options(**fields).as_kwargs()
