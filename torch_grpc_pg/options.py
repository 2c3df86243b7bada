"""Settings of the grpc backend. Every field defaults to its environment variable."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


def _env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1 or 0")


@dataclass
class Options:
    """Pass as ``init_process_group("grpc", pg_options=Options(...))``, or set the variables.

    See the README's table of options for what each one does.
    """

    bind_host: str = field(
        default_factory=lambda: _env_str("TORCH_GRPC_PG_BIND_HOST", "0.0.0.0")
    )
    port: int = field(default_factory=lambda: _env_int("TORCH_GRPC_PG_PORT", 0))
    advertise_host: str = field(
        default_factory=lambda: _env_str("TORCH_GRPC_PG_ADVERTISE_HOST")
    )
    unix_sockets: bool = field(
        default_factory=lambda: _env_bool("TORCH_GRPC_PG_UNIX_SOCKETS", True)
    )
    auth_token: str = field(
        default_factory=lambda: _env_str("TORCH_GRPC_PG_AUTH_TOKEN")
    )
    tls_cert: str = field(default_factory=lambda: _env_str("TORCH_GRPC_PG_TLS_CERT"))
    tls_key: str = field(default_factory=lambda: _env_str("TORCH_GRPC_PG_TLS_KEY"))
    tls_ca: str = field(default_factory=lambda: _env_str("TORCH_GRPC_PG_TLS_CA"))
    tls_server_name: str = field(
        default_factory=lambda: _env_str("TORCH_GRPC_PG_TLS_SERVER_NAME")
    )
    chunk_bytes: int = field(
        default_factory=lambda: _env_int("TORCH_GRPC_PG_CHUNK_BYTES", 2 << 20)
    )
    direct_max_bytes: int = field(
        default_factory=lambda: _env_int("TORCH_GRPC_PG_DIRECT_MAX_BYTES", 64 << 10)
    )
    max_queued_frames: int = field(
        default_factory=lambda: _env_int("TORCH_GRPC_PG_MAX_QUEUED_FRAMES", 8)
    )
    connect_timeout: timedelta = field(
        default_factory=lambda: timedelta(
            seconds=_env_int("TORCH_GRPC_PG_CONNECT_TIMEOUT", 60)
        )
    )

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(
                f"grpc backend: port {self.port} is not in [0, 65535] (TORCH_GRPC_PG_PORT)"
            )
        if self.chunk_bytes < 1024:
            raise ValueError(
                f"grpc backend: chunk_bytes={self.chunk_bytes} is too small; use at least 1024 "
                "(TORCH_GRPC_PG_CHUNK_BYTES, default 2 MiB)"
            )
        if self.direct_max_bytes < 0:
            raise ValueError(
                "grpc backend: direct_max_bytes must be >= 0 (TORCH_GRPC_PG_DIRECT_MAX_BYTES)"
            )
        if self.max_queued_frames < 1:
            raise ValueError(
                "grpc backend: max_queued_frames must be >= 1 (TORCH_GRPC_PG_MAX_QUEUED_FRAMES)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError(
                "grpc backend: TLS needs both a certificate and a key "
                "(TORCH_GRPC_PG_TLS_CERT and TORCH_GRPC_PG_TLS_KEY)"
            )

    def as_kwargs(self) -> dict[str, Any]:
        self.validate()
        return {
            "bind_host": self.bind_host,
            "port": self.port,
            "advertise_host": self.advertise_host,
            "unix_sockets": self.unix_sockets,
            "auth_token": self.auth_token,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
            "tls_ca": self.tls_ca,
            "tls_server_name": self.tls_server_name,
            "chunk_bytes": self.chunk_bytes,
            "direct_max_bytes": self.direct_max_bytes,
            "max_queued_frames": self.max_queued_frames,
            "connect_timeout": self.connect_timeout,
        }
