"""What int8 on the wire would cost in accuracy, simulated: why wire_dtype stops at 16 bits.

    .venv/bin/python benchmarks/wire_int8_error.py

`wire_dtype` offers bfloat16 and float16. INTELLECT-1 (arXiv 2412.01152) reduced its
outer gradients in int8 with a scale per block. This script simulates, in one process and
without the backend, what int8 would do to the case the backend's two levels run: two hosts
of two ranks. Each host sums its two ranks in float32; its partial sum crosses to the other
host narrowed, is widened and added there in float32; the finished sum crosses back
narrowed. int8 is symmetric with one scale per block (the block's largest magnitude / 127,
round to nearest); a block of 2M elements is one whole 2 MiB chunk, the finest scale that
costs nothing on the wire, smaller ones cost 4 bytes of scale per block.

The model is checked first: the same simulation with bfloat16 and float16 must give what the
backend itself gave on these inputs (docs/options.md: median relative error 1.6e-3 and
2.0e-4; RMS relative error, there the norm of the error over the norm of the sum, 2.0e-3 and
2.5e-4). Then two measures per wire format:

- the allreduce's error against a float64 sum of the same float32 inputs, on
  tests/wire_dtype_job.py's inputs (normal values scaled by 2^-4 to 2^4 per element);
- training: tests/wire_dtype_train.py's model and batches on four ranks, DDP-style (each
  rank's gradient, averaged through the simulated allreduce, one bucket), 40 steps of SGD
  with momentum: the largest relative difference of the mean loss from float32's. Unlike
  the backend's own training check, the parameters' first broadcast is not narrowed here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import wire_dtype_job
import wire_dtype_train

Narrow = Callable[[torch.Tensor], torch.Tensor]  # float32 -> float32 through the wire
CHUNK_ELEMENTS = 2 << 20  # a 2 MiB chunk of int8
RANKS_PER_HOST = 2


def through(dtype: torch.dtype) -> Narrow:
    return lambda v: v.to(dtype).float()


def int8_blocks(block: int) -> Narrow:
    def narrow(v: torch.Tensor) -> torch.Tensor:
        n = v.numel()
        padded = F.pad(v, (0, (-n) % block)).view(-1, block)
        scale = padded.abs().amax(dim=1, keepdim=True) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(padded / scale).clamp(-127, 127)
        return (q * scale).view(-1)[:n]

    return narrow


def two_hosts_allreduce(inputs: torch.Tensor, narrow: Narrow) -> torch.Tensor:
    """inputs: (4, n) float32, ranks 0-1 on host A, 2-3 on host B. Host B finishes the
    first half and host A the second, as the two levels' ring across hosts splits it."""
    host_a = inputs[0] + inputs[1]
    host_b = inputs[2] + inputs[3]
    half = inputs.shape[1] // 2
    out = torch.empty_like(host_a)
    out[:half] = narrow(narrow(host_a[:half]) + host_b[:half])
    out[half:] = narrow(narrow(host_b[half:]) + host_a[half:])
    return out


def allreduce_error(narrow: Narrow) -> dict[str, float]:
    n = wire_dtype_job.LARGE
    inputs = torch.stack(
        [
            wire_dtype_job.make_input("all_reduce_large", r, n, torch.float32)
            for r in range(2 * RANKS_PER_HOST)
        ]
    )
    exact = inputs.double().sum(0)
    got = two_hosts_allreduce(inputs, narrow).double()
    relative = ((got - exact).abs() / exact.abs().clamp_min(1e-30)).float()
    return {
        "median": float(relative.median()),
        "norm": float((got - exact).norm() / exact.norm()),
        "worst_of_magnitudes": float(
            ((got - exact).abs() / inputs.double().abs().sum(0)).max()
        ),
    }


def training_losses(narrow: Narrow | None) -> list[float]:
    world = 2 * RANKS_PER_HOST
    model = wire_dtype_train.initial_model()
    opt = torch.optim.SGD(model.parameters(), lr=wire_dtype_train.LR, momentum=0.9)
    params = list(model.parameters())
    losses = []
    for step in range(wire_dtype_train.STEPS):
        grads, step_losses = [], []
        for rank in range(world):
            x, y = wire_dtype_train.batch(rank, step)
            loss = F.mse_loss(model(x), y)
            step_losses.append(loss.item())
            grads.append(
                torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
            )
        stacked = torch.stack(grads)
        summed = (
            stacked.sum(0) if narrow is None else two_hosts_allreduce(stacked, narrow)
        )
        mean = summed / world
        offset = 0
        for p in params:
            p.grad = mean[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        losses.append(statistics.mean(step_losses))
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    formats: dict[str, Narrow] = {
        "bfloat16": through(torch.bfloat16),
        "float16": through(torch.float16),
        "int8, one scale per 2 MiB chunk": int8_blocks(CHUNK_ELEMENTS),
        "int8, one scale per 4096": int8_blocks(4096),
        "int8, one scale per 256": int8_blocks(256),
        "int8, one scale per 32": int8_blocks(32),
    }
    reference = training_losses(None)
    print(
        "format | allreduce median rel. error | ‖error‖ / ‖sum‖ | "
        "largest error / sum of magnitudes | loss vs float32, largest"
    )
    print("--- | --- | --- | --- | ---")
    for name, narrow in formats.items():
        error = allreduce_error(narrow)
        losses = training_losses(narrow)
        drift = max(abs(a - b) / b for a, b in zip(losses, reference, strict=True))
        print(
            f"{name} | {error['median']:.2g} | {error['norm']:.2g} | "
            f"{error['worst_of_magnitudes']:.2g} | {drift:.3%}"
        )
    print(
        f"\nfloat32 training: loss {reference[0]:.4f} -> {reference[-1]:.4f} "
        f"over {len(reference)} steps"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
