"""Settings of the grpc backend. Every field defaults to its environment variable."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

import torch

KIB = 1 << 10
MIB = 1 << 20

# Settings of the process's one gRPC server, which every process group of the
# process shares: a group that leaves one unset inherits the running server's.
SERVER_FIELDS = (
    "bind_host",
    "port",
    "unix_sockets",
    "auth_token",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "tls_server_name",
    "health_public",
    "shared_memory",
    "encrypt",
)


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


# Each field: its variable, and how to read that variable.
_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "bind_host": ("TORCH_GRPC_PG_BIND_HOST", _env_str),
    "port": ("TORCH_GRPC_PG_PORT", lambda v: _env_int(v, 0)),
    "advertise_host": ("TORCH_GRPC_PG_ADVERTISE_HOST", _env_str),
    "unix_sockets": ("TORCH_GRPC_PG_UNIX_SOCKETS", lambda v: _env_bool(v, True)),
    "auth_token": ("TORCH_GRPC_PG_AUTH_TOKEN", _env_str),
    "tls_cert": ("TORCH_GRPC_PG_TLS_CERT", _env_str),
    "tls_key": ("TORCH_GRPC_PG_TLS_KEY", _env_str),
    "tls_ca": ("TORCH_GRPC_PG_TLS_CA", _env_str),
    "tls_server_name": ("TORCH_GRPC_PG_TLS_SERVER_NAME", _env_str),
    "chunk_bytes": ("TORCH_GRPC_PG_CHUNK_BYTES", lambda v: _env_int(v, 2 * MIB)),
    "direct_max_bytes": (
        "TORCH_GRPC_PG_DIRECT_MAX_BYTES",
        lambda v: _env_int(v, 64 * KIB),
    ),
    "max_queued_frames": (
        "TORCH_GRPC_PG_MAX_QUEUED_FRAMES",
        lambda v: _env_int(v, 8),
    ),
    "connect_timeout": (
        "TORCH_GRPC_PG_CONNECT_TIMEOUT",
        lambda v: timedelta(seconds=_env_int(v, 60)),
    ),
    "flight_recorder_size": (
        "TORCH_GRPC_PG_FLIGHT_RECORDER_SIZE",
        lambda v: _env_int(v, 64),
    ),
    "flight_recorder_dir": ("TORCH_GRPC_PG_FLIGHT_RECORDER_DIR", _env_str),
    "health_public": ("TORCH_GRPC_PG_HEALTH_PUBLIC", lambda v: _env_bool(v, False)),
    "tune_malloc": ("TORCH_GRPC_PG_TUNE_MALLOC", lambda v: _env_bool(v, True)),
    "shared_memory": ("TORCH_GRPC_PG_SHARED_MEMORY", lambda v: _env_bool(v, True)),
    "encrypt": ("TORCH_GRPC_PG_ENCRYPT", lambda v: _env_bool(v, True)),
    "wire_dtype": ("TORCH_GRPC_PG_WIRE_DTYPE", lambda v: _env_str(v, "float32")),
    "two_level": ("TORCH_GRPC_PG_TWO_LEVEL", lambda v: _env_bool(v, True)),
    "connections_per_peer": (
        "TORCH_GRPC_PG_CONNECTIONS_PER_PEER",
        lambda v: _env_int(v, 1),
    ),
}

# What float32 may travel as on links between hosts (wire_dtype).
WIRE_DTYPES = ("float32", "bfloat16", "float16")

# Inclusive ranges of the numeric fields. chunk_bytes bounds what a rank
# buffers per frame before it can check it, so its ceiling is a security bound.
_RANGES: dict[str, tuple[int, int]] = {
    "port": (0, 65535),
    "chunk_bytes": (4 * KIB, 64 * MIB),
    "direct_max_bytes": (0, 64 * MIB),
    "max_queued_frames": (1, 1024),
    "flight_recorder_size": (0, 1 << 20),
    "connections_per_peer": (1, 16),
}
_MAX_CONNECT_TIMEOUT = timedelta(days=1)


@dataclass
class Options:
    """Pass as ``init_process_group("grpc", pg_options=Options(...))``, or set the variables.

    A field left out takes its environment variable's value, except the server's settings
    (``SERVER_FIELDS``), which a later group inherits from the process's running server.
    See the README's table of options for what each one does.
    """

    bind_host: str = None  # type: ignore[assignment]
    port: int = None  # type: ignore[assignment]
    advertise_host: str = None  # type: ignore[assignment]
    unix_sockets: bool = None  # type: ignore[assignment]
    auth_token: str = field(default=None, repr=False)  # type: ignore[assignment]
    tls_cert: str = None  # type: ignore[assignment]
    tls_key: str = None  # type: ignore[assignment]
    tls_ca: str = None  # type: ignore[assignment]
    tls_server_name: str = None  # type: ignore[assignment]
    chunk_bytes: int = None  # type: ignore[assignment]
    direct_max_bytes: int = None  # type: ignore[assignment]
    max_queued_frames: int = None  # type: ignore[assignment]
    connect_timeout: timedelta = None  # type: ignore[assignment]
    flight_recorder_size: int = None  # type: ignore[assignment]
    flight_recorder_dir: str = None  # type: ignore[assignment]
    health_public: bool = None  # type: ignore[assignment]
    tune_malloc: bool = None  # type: ignore[assignment]
    shared_memory: bool = None  # type: ignore[assignment]
    encrypt: bool = None  # type: ignore[assignment]
    wire_dtype: str = None  # type: ignore[assignment]
    two_level: bool = None  # type: ignore[assignment]
    connections_per_peer: int = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self._given = frozenset(
            f.name for f in fields(self) if getattr(self, f.name) is not None
        )
        for f in fields(self):
            if getattr(self, f.name) is None:
                variable, read = _ENV[f.name]
                setattr(self, f.name, read(variable))
        # torch.bfloat16 reads as "bfloat16", as the variable is written.
        if isinstance(self.wire_dtype, torch.dtype):
            self.wire_dtype = str(self.wire_dtype).removeprefix("torch.")
        elif self.wire_dtype == "":
            self.wire_dtype = "float32"

    def given(self, name: str) -> bool:
        """Whether the field was passed explicitly rather than taken from the environment."""
        return name in self._given

    def validate(self) -> None:
        for name, (low, high) in _RANGES.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(
                    f"grpc backend: {name}={value} is not in [{low}, {high}] ({_ENV[name][0]})"
                )
        if not timedelta(0) < self.connect_timeout <= _MAX_CONNECT_TIMEOUT:
            raise ValueError(
                f"grpc backend: connect_timeout={self.connect_timeout} must be positive and at most "
                "one day (TORCH_GRPC_PG_CONNECT_TIMEOUT, in seconds)"
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(
                f"grpc backend: wire_dtype={self.wire_dtype!r} is not one of "
                f"{', '.join(WIRE_DTYPES)} (TORCH_GRPC_PG_WIRE_DTYPE)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError(
                "grpc backend: TLS needs both a certificate and a key "
                "(TORCH_GRPC_PG_TLS_CERT and TORCH_GRPC_PG_TLS_KEY)"
            )

    def as_kwargs(self, running: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The fields, validated; those of the running server's that were not given are inherited."""
        self.validate()
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if running is not None:
            for name in SERVER_FIELDS:
                if not self.given(name):
                    values[name] = running[name]
        return values
