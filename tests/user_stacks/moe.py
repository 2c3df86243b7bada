"""Mixture-of-experts token routing with uneven, data-dependent all_to_all_single.

Each rank hosts one expert. A router sends every token to one expert; the
token counts are exchanged first (an all_to_all_single of counts), then the
tokens go out with uneven split sizes and come back the same way, through
the autograd-aware all_to_all_single so that the experts train.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from dist_harness import RankContext
from user_stacks.common import FP32_TOL, FP64_TOL, assert_close, generator

MODEL = 6


def tokens_of(rank: int) -> torch.Tensor:
    # A different number of tokens on each rank.
    return torch.randn(5 + 4 * rank, MODEL, generator=generator(71, rank))


def router() -> torch.Tensor:
    return torch.randn(MODEL, 8, generator=generator(73))


def route(rank: int, world: int) -> torch.Tensor:
    """The expert (= rank) of each of this rank's tokens."""
    logits = tokens_of(rank) @ router()[:, :world]
    if rank == world - 1:
        logits[:, 0] = float("-inf")  # this rank sends nothing to expert 0
    return logits.argmax(dim=1)


def expert(index: int) -> nn.Linear:
    torch.manual_seed(800 + index)
    return nn.Linear(MODEL, MODEL)


def forward_backward(
    group: dist.ProcessGroup, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """This rank's tokens after their experts, the counts it received, and
    the gradients of its expert."""
    x = tokens_of(rank).requires_grad_()
    dest = route(rank, world)
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    received = dist_fn.all_to_all_single(
        x.new_empty(sum(recv_splits), MODEL),
        x[order],
        output_split_sizes=recv_splits,
        input_split_sizes=send_splits,
        group=group,
    )
    mine = expert(rank)
    processed = torch.tanh(mine(received))
    returned = dist_fn.all_to_all_single(
        x.new_empty(len(dest), MODEL),
        processed,
        output_split_sizes=send_splits,
        input_split_sizes=recv_splits,
        group=group,
    )
    out = torch.empty_like(returned).index_copy(0, order, returned)
    # Each rank's loss; their sum is the loss that the replay differentiates.
    (out.pow(2).sum() + 0.5 * out.sum()).backward()
    assert x.grad is not None
    grads = {"input": x.grad}
    for name, param in mine.named_parameters():
        assert param.grad is not None, name
        grads[name] = param.grad
    return out.detach(), recv_counts, grads


def local_replay(
    world: int,
) -> tuple[list[torch.Tensor], list[nn.Linear], list[torch.Tensor]]:
    experts = [expert(i).double() for i in range(world)]
    inputs = [tokens_of(r).double().requires_grad_() for r in range(world)]
    outputs = []
    for r, x in enumerate(inputs):
        dest = route(r, world)
        rows = [torch.tanh(experts[int(d)](x[i])) for i, d in enumerate(dest)]
        outputs.append(torch.stack(rows))
    sum(o.pow(2).sum() + 0.5 * o.sum() for o in outputs).backward()
    return outputs, experts, inputs


def check(ctx: RankContext, gloo: dist.ProcessGroup) -> None:
    world, rank = ctx.world_size, ctx.rank
    default = dist.group.WORLD
    assert default is not None
    out, recv_counts, grads = forward_backward(default, rank, world)
    gloo_out, gloo_counts, gloo_grads = forward_backward(gloo, rank, world)
    counts = torch.stack(
        [torch.bincount(route(r, world), minlength=world) for r in range(world)]
    )
    # The routing is uneven and has an empty split, as intended.
    assert len(set(counts.flatten().tolist())) > 2 and counts[world - 1, 0] == 0, counts
    assert recv_counts.tolist() == counts[:, rank].tolist(), (recv_counts, counts)
    assert gloo_counts.tolist() == recv_counts.tolist()
    # Moving tokens is exact; the gradients of the expert add up tokens in
    # another order than gloo's only if the backend delivered them differently.
    assert_close(out, gloo_out, "output vs gloo", {"rtol": 0.0, "atol": 0.0})
    for name, grad in grads.items():
        assert_close(grad, gloo_grads[name], f"{name} grad vs gloo", FP32_TOL)
    outputs, experts, inputs = local_replay(world)
    assert_close(out, outputs[rank], "output vs float64 replay", FP64_TOL)
    assert inputs[rank].grad is not None
    assert_close(grads["input"], inputs[rank].grad, "input grad vs replay", FP64_TOL)
    for name, param in experts[rank].named_parameters():
        assert param.grad is not None
        assert_close(grads[name], param.grad, f"{name} grad vs replay", FP64_TOL)
