"""A small pre-norm transformer, whole or split across ranks as Megatron splits it.

Attention: the QKV projection is column-parallel (each rank holds heads / W heads), the
output projection row-parallel; the MLP's first linear is column-parallel, its second
row-parallel. Each row-parallel layer leaves a partial sum on every rank, which one
in-place allreduce completes, before its bias is added (once, not W times). That makes
two allreduces of tokens x hidden floats per layer. The same forward() runs the whole
model with no allreduce: the single-process reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Layer = dict[str, torch.Tensor]
AllReduce = Callable[[torch.Tensor], object]


@dataclass(frozen=True)
class Shape:
    hidden: int = 1024
    heads: int = 16
    layers: int = 2
    ffn_factor: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn(self) -> int:
        return self.hidden * self.ffn_factor


def full_layers(shape: Shape, seed: int) -> list[Layer]:
    """Every rank draws the same weights from the seed, then keeps its shard."""
    gen = torch.Generator().manual_seed(seed)
    h, f = shape.hidden, shape.ffn

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * 0.02

    return [
        {
            "ln1_w": 1 + rand(h),
            "ln1_b": rand(h),
            "qkv_w": rand(3 * h, h),
            "qkv_b": rand(3 * h),
            "out_w": rand(h, h),
            "out_b": rand(h),
            "ln2_w": 1 + rand(h),
            "ln2_b": rand(h),
            "fc1_w": rand(f, h),
            "fc1_b": rand(f),
            "fc2_w": rand(h, f),
            "fc2_b": rand(h),
        }
        for _ in range(shape.layers)
    ]


def shard_layers(
    layers: list[Layer], shape: Shape, rank: int, world: int
) -> list[Layer]:
    """This rank's columns of QKV and fc1, its rows (input features) of out and fc2."""
    if shape.heads % world or shape.ffn % world:
        raise ValueError(f"{shape} does not split over {world} ranks")
    heads = slice(rank * shape.heads // world, (rank + 1) * shape.heads // world)
    ffn = slice(rank * shape.ffn // world, (rank + 1) * shape.ffn // world)
    h, d = shape.hidden, shape.head_dim
    out = []
    for layer in layers:
        # QKV's rows are [q heads | k heads | v heads]: take this rank's heads of each.
        qkv_w = layer["qkv_w"].view(3, shape.heads, d, h)[:, heads].reshape(-1, h)
        qkv_b = layer["qkv_b"].view(3, shape.heads, d)[:, heads].reshape(-1)
        cols = slice(heads.start * d, heads.stop * d)
        out.append(
            {
                **layer,
                "qkv_w": qkv_w.contiguous(),
                "qkv_b": qkv_b.contiguous(),
                "out_w": layer["out_w"][:, cols].contiguous(),
                "fc1_w": layer["fc1_w"][ffn].contiguous(),
                "fc1_b": layer["fc1_b"][ffn].contiguous(),
                "fc2_w": layer["fc2_w"][:, ffn].contiguous(),
            }
        )
    return out


def forward(
    layers: list[Layer], x: torch.Tensor, shape: Shape, allreduce: AllReduce | None
) -> torch.Tensor:
    """x: (batch, tokens, hidden). allreduce None: the layers are whole."""
    batch, tokens, h = x.shape
    d = shape.head_dim
    for layer in layers:
        y = F.layer_norm(x, (h,), layer["ln1_w"], layer["ln1_b"])
        qkv = F.linear(y, layer["qkv_w"], layer["qkv_b"])
        local_heads = qkv.shape[-1] // (3 * d)
        q, k, v = qkv.view(batch, tokens, 3, local_heads, d).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = attn.transpose(1, 2).reshape(batch, tokens, local_heads * d)
        partial = F.linear(attn, layer["out_w"])
        if allreduce is not None:
            allreduce(partial)
        x = x + partial + layer["out_b"]
        y = F.layer_norm(x, (h,), layer["ln2_w"], layer["ln2_b"])
        partial = F.linear(
            F.gelu(F.linear(y, layer["fc1_w"], layer["fc1_b"])), layer["fc2_w"]
        )
        if allreduce is not None:
            allreduce(partial)
        x = x + partial + layer["fc2_b"]
    return x
