"""Comparisons and deterministic data shared by the user-stack checks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

# Two float32 computations that differ only in summation order (or not at all).
FP32_TOL: dict[str, float] = {"rtol": 1e-5, "atol": 1e-6}
# A float32 computation against the same computation replayed in float64.
FP64_TOL: dict[str, float] = {"rtol": 1e-4, "atol": 1e-5}


def generator(*parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = seed * 1_000_003 + part
    return torch.Generator().manual_seed(seed)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, tol: Mapping[str, float]
) -> None:
    torch.testing.assert_close(
        actual.detach().to(expected.dtype),
        expected.detach(),
        rtol=tol["rtol"],
        atol=tol["atol"],
        msg=lambda m: f"{what}: {m}",
    )


def assert_all_close(
    actual: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    what: str,
    tol: Mapping[str, float],
) -> None:
    assert actual.keys() == expected.keys(), (what, actual.keys(), expected.keys())
    for name, tensor in actual.items():
        assert_close(tensor, expected[name], f"{what}, {name}", tol)


def assert_moved(
    trained: Mapping[str, torch.Tensor],
    initial: Mapping[str, torch.Tensor],
    least: float,
) -> None:
    """Training changed every tensor by more than ``least``: the comparisons above
    are between models that moved well beyond their tolerance."""
    for name, tensor in trained.items():
        change = (tensor.double() - initial[name].double()).abs().max().item()
        assert change > least, f"{name} moved by {change:.3g} only, not > {least:.3g}"


def tested_mesh(world: int, backend: str) -> DeviceMesh:
    """A 1-D mesh over the default group, built the way users build it."""
    mesh = init_device_mesh("cpu", (world,))
    assert dist.get_backend(mesh.get_group()) == backend, mesh.get_group()
    return mesh
