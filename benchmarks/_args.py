"""Command-line parsing shared by the benchmark scripts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
}

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
_DTYPE_ALIASES = {
    "f32": "float32",
    "fp32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}; use e.g. 4, 64K, 1MiB, 256M"
        )
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    """`4,1M,64M`, or a geometric range `4:256M[:4]` (start:stop:factor, ends included)."""
    sizes: list[int] = []
    for part in text.split(","):
        if ":" in part:
            fields = part.split(":")
            start, stop = parse_size(fields[0]), parse_size(fields[1])
            factor = int(fields[2]) if len(fields) > 2 else 4
            if start < 1 or factor < 2:
                raise argparse.ArgumentTypeError(f"bad range {part!r}")
            size = start
            while size <= stop:
                sizes.append(size)
                size *= factor
        else:
            sizes.append(parse_size(part))
    return sizes


def parse_dtypes(text: str) -> list[str]:
    names = [
        _DTYPE_ALIASES.get(n.strip().lower(), n.strip().lower())
        for n in text.split(",")
        if n.strip()
    ]
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown dtype(s) {unknown}; known: {sorted(DTYPES)}"
        )
    return names


def parse_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_ints(text: str) -> list[int]:
    return [int(item) for item in parse_list(text)]


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backends",
        type=parse_list,
        default=None,
        help="comma list; default grpc,gloo on cpu, grpc,nccl on cuda (last: reference)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--world-sizes", type=parse_ints, default=None, help="comma list (default 2)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="short pass with the key rows only"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out"
    )
    parser.add_argument(
        "--threads-per-rank",
        type=int,
        default=None,
        help="torch intra-op threads per rank (default: cores // world, at least 1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a collective may take before a rank gives up",
    )


def default_backends(device: str) -> list[str]:
    return ["grpc", "nccl"] if device == "cuda" else ["grpc", "gloo"]


def reference_backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def candidate_backend(requested: list[str] | None, device: str) -> str:
    """The backend the targets judge: the first requested one but the reference."""
    ref = reference_backend(device)
    return next((b for b in requested or default_backends(device) if b != ref), "grpc")
