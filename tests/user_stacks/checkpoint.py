"""torch.distributed.checkpoint: save and load an FSDP2 model and its optimizer."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from dist_harness import RankContext
from user_stacks.common import FP32_TOL, generator, tested_mesh

Flat = dict[str, torch.Tensor]


def sharded_model(
    mesh: DeviceMesh, seed: int
) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # 6 output rows: uneven shards would appear at world 4; 3 rows at world 2.
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    gen = generator(53, rank)
    x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def flatten(tree: object, prefix: str = "") -> Flat:
    """Every tensor of a (model, optimizer) state dict, full and keyed by its path."""
    flat: Flat = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}/{key}"))
    elif isinstance(tree, DTensor):
        flat[prefix] = tree.full_tensor().detach().clone()
    elif isinstance(tree, torch.Tensor):
        flat[prefix] = tree.detach().clone()
    elif isinstance(tree, (int, float)):
        flat[prefix] = torch.tensor(float(tree))
    return flat


def state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}


def save(mesh: DeviceMesh, group: dist.ProcessGroup, rank: int, path: str) -> Flat:
    model, opt = sharded_model(mesh, seed=1)
    train_step(model, opt, rank)
    train_step(model, opt, rank)
    sd = state(model, opt)
    dcp.save(sd, checkpoint_id=path, process_group=group)
    return flatten(sd)


def load(mesh: DeviceMesh, group: dist.ProcessGroup, path: str) -> Flat:
    # Other initial weights, and Adam state from a step of its own: all must be replaced.
    model, opt = sharded_model(mesh, seed=2)
    train_step(model, opt, rank=99)
    sd = state(model, opt)
    before = flatten(sd)
    dcp.load(sd, checkpoint_id=path, process_group=group)
    set_state_dict(
        model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
    )
    loaded = flatten(state(model, opt))
    assert loaded.keys() == before.keys()
    # Otherwise an ignored checkpoint would go unnoticed.
    unchanged = [k for k in before if torch.equal(before[k], loaded[k])]
    assert all("step" in k for k in unchanged), f"not replaced: {unchanged}"
    return loaded


def assert_same(actual: Flat, expected: Flat, what: str, exact: bool) -> None:
    assert actual.keys() == expected.keys(), (what, actual.keys(), expected.keys())
    tol = {"rtol": 0.0, "atol": 0.0} if exact else FP32_TOL
    for key, tensor in actual.items():
        torch.testing.assert_close(
            tensor, expected[key], **tol, msg=lambda m, k=key: f"{what}, {k}: {m}"
        )


def check(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    default = dist.group.WORLD
    assert default is not None
    mesh = tested_mesh(ctx.world_size, ctx.backend)
    gloo_mesh = DeviceMesh.from_group(gloo, "cpu")
    tested_dir = os.path.join(ctx.tmp_dir, "dcp-tested")
    gloo_dir = os.path.join(ctx.tmp_dir, "dcp-gloo")
    saved = save(mesh, default, ctx.rank, tested_dir)
    saved_by_gloo = save(gloo_mesh, gloo, ctx.rank, gloo_dir)
    assert any(key.startswith("/optim/state/") for key in saved), sorted(saved)
    # Same training over both backends, up to summation order.
    assert_same(saved, saved_by_gloo, "saved vs saved under gloo", exact=False)
    # A checkpoint holds exactly what was saved, whichever backend reads it back.
    assert_same(load(mesh, default, tested_dir), saved, "saved, loaded", True)
    assert_same(load(gloo_mesh, gloo, tested_dir), saved, "loaded under gloo", True)
    assert_same(load(mesh, default, gloo_dir), saved_by_gloo, "saved under gloo", True)
