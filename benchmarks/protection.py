"""What each protection of the traffic costs: grpc over TCP on one host, plaintext against a
token (encrypted or authenticated frames), TLS and mutual TLS, with gloo beside them.

    .venv/bin/python benchmarks/protection.py
    .venv/bin/python benchmarks/protection.py --modes plain,token,mtls --cases allreduce:64M

Every mode is a server setting, which one process serves one way only, so each (mode,
round) gets fresh spawned ranks whose default group is the backend, as user_mode.py runs
them; the modes take turns, round after round, in alternating order. Unix sockets are off
(same-host links carry no protection; TCP is what crosses hosts). The summary gives each
mode's median bus bandwidth over rounds, its range, and the median of its per-round ratios
to plaintext grpc. `openssl speed -evp aes-256-gcm` gives the cipher's own limit on this CPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from _report import Column, format_table, machine_info, write_outputs
from _spawn import WorldFailed, run_world
from user_mode import TABLE, parse_cases, summarize, user_rank

TOKEN = "benchmark-token"
TABLE_WITHOUT_BACKEND = [c for c in TABLE if c.key != "backend"]

# Mode: (backend, the variables its ranks run with).
MODES: dict[str, tuple[str, dict[str, str]]] = {
    "plain": ("grpc", {}),
    "token": ("grpc", {"TORCH_GRPC_PG_AUTH_TOKEN": TOKEN}),
    "token-mac": (
        "grpc",
        {"TORCH_GRPC_PG_AUTH_TOKEN": TOKEN, "TORCH_GRPC_PG_ENCRYPT": "0"},
    ),
    "tls": ("grpc", {"tls": "server"}),
    "mtls": ("grpc", {"tls": "mutual"}),
    "mtls+token": ("grpc", {"tls": "mutual", "TORCH_GRPC_PG_AUTH_TOKEN": TOKEN}),
    "gloo": ("gloo", {}),
}


def mode_env(mode: str, pki: dict[str, str]) -> dict[str, str]:
    """The variables of `mode`, TLS files included."""
    env = {"TORCH_GRPC_PG_UNIX_SOCKETS": "0"}
    for name, value in MODES[mode][1].items():
        if name != "tls":
            env[name] = value
        elif value == "server":
            # Servers prove themselves, callers do not: no TORCH_GRPC_PG_TLS_CA, so
            # callers check servers against gRPC's roots, which name the test CA here.
            env |= {k: v for k, v in pki.items() if k != "TORCH_GRPC_PG_TLS_CA"}
            env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = pki["TORCH_GRPC_PG_TLS_CA"]
        else:
            env |= pki
    return env


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`env` in this process's environment, which spawned ranks inherit, for a while."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cipher_limit() -> str:
    """`openssl speed`'s AES-256-GCM throughput on 16 KiB blocks, one core."""
    try:
        out = subprocess.run(
            [
                "openssl",
                "speed",
                "-seconds",
                "1",
                "-bytes",
                "16384",
                "-evp",
                "aes-256-gcm",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        kbytes = float(out.strip().splitlines()[-1].split()[-1].rstrip("k"))
        return f"{kbytes * 1000 / 1e9:.2f} GB/s"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--modes",
        default="plain,token,token-mac,tls,mtls,mtls+token,gloo",
        help=f"comma list of {', '.join(MODES)}",
    )
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument(
        "--cases", type=parse_cases, default=parse_cases("allreduce:64M,allreduce:1M")
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from torch_grpc_pg.pki import make_local_pki

    args = parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"unknown modes: {', '.join(unknown)}", file=sys.stderr)
        return 2
    machine = machine_info()
    rows: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory() as pki_dir:
        pki = make_local_pki(Path(pki_dir))
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                backend = MODES[mode][0]
                payload = {
                    "backend": backend,
                    "cases": args.cases,
                    "warmup": args.warmup,
                    "min_time": args.min_time,
                    "warm_malloc": False,
                }
                tag = {"world": args.world, "backend": mode, "round": round_}

                def on_message(kind: str, data: Any, tag: dict = tag) -> None:
                    if kind == "row":
                        rows.append({**data, **tag})

                try:
                    with environment(mode_env(mode, pki)):
                        run_world(
                            user_rank,
                            args.world,
                            payload,
                            on_message,
                            threads=0,
                            timeout_s=args.timeout,
                            default_backend=backend,
                        )
                except WorldFailed as exc:
                    failed = True
                    print(f"error: {mode}: {exc}", file=sys.stderr)
    summary = summarize(rows, "plain")
    limit = cipher_limit()
    print(
        f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['platform']}, "
        f"torch {machine['torch']}; AES-256-GCM alone: {limit} per core (openssl speed)"
    )
    print(
        f"threads per rank: torch's default ({torch.get_num_threads()} in this process)"
    )
    print("TCP on one host (TORCH_GRPC_PG_UNIX_SOCKETS=0); ratios to plaintext grpc\n")
    print(format_table(summary, [Column("mode", "backend"), *TABLE_WITHOUT_BACKEND]))
    meta = {
        **machine,
        "command": " ".join(sys.argv),
        "mode": "protection",
        "aes_256_gcm": limit,
    }
    paths = write_outputs(
        args.out, "protection_cpu", meta, {"rows": summary, "runs": rows}
    )
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
