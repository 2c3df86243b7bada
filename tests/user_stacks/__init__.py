"""Distributed training stacks that users build on torch.distributed, one module each.

Every module exposes rank-side checks ``(ctx, gloo) -> None`` that run the stack
over the backend under test and over gloo, and compare both with each other
and, where the stack is exact enough, with a local float64 replay.
"""
