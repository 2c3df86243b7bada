"""Place input values in contiguous and non-contiguous tensors.

A collective on a non-contiguous view must write its result through the view
into the caller's storage and leave the storage outside the view alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Prime, so not divisible by any world size the suite uses.
ODD_NUMEL = 1237
TRANSPOSED_SHAPE = (37, 29)  # 1073 elements, not divisible by 2, 3 or 4 either
TRANSPOSED_NUMEL = TRANSPOSED_SHAPE[0] * TRANSPOSED_SHAPE[1]
# Large enough to span many transport frames, small enough to run at every world size.
MEDIUM_NUMEL = 300_007

# (numel, layout) pairs every collective runs over.
SHAPES: tuple[tuple[int, str], ...] = (
    (0, "contiguous"),
    (1, "contiguous"),
    (ODD_NUMEL, "contiguous"),
    (TRANSPOSED_NUMEL, "transposed"),
    (ODD_NUMEL, "strided"),
)


@dataclass
class Placed:
    tensor: torch.Tensor  # what the collective is given
    gaps: torch.Tensor | None = None  # storage around ``tensor`` that must not change
    gaps_before: torch.Tensor | None = None

    def logical(self) -> torch.Tensor:
        """The tensor's elements in row-major order, comparable with the 1-D input."""
        return self.tensor.reshape(-1)

    def assert_gaps_untouched(self) -> None:
        if self.gaps is not None:
            assert self.gaps_before is not None
            torch.testing.assert_close(
                self.gaps,
                self.gaps_before,
                rtol=0,
                atol=0,
                msg=lambda m: f"wrote outside the strided view: {m}",
            )


def place(values: torch.Tensor, layout: str) -> Placed:
    """A tensor holding ``values`` (1-D) in ``layout``."""
    if layout == "contiguous":
        return Placed(values.clone())
    if layout == "transposed":
        rows, cols = TRANSPOSED_SHAPE
        assert values.numel() == rows * cols
        base = torch.empty(cols, rows, dtype=values.dtype)
        view = base.t()
        view.copy_(values.view(rows, cols))
        assert not view.is_contiguous()
        return Placed(view)
    if layout == "strided":
        base = torch.empty(2 * values.numel(), dtype=values.dtype)
        # Gap values differ from anything a correct collective could write there.
        base[1::2] = values.flip(0)
        view = base[::2]
        view.copy_(values)
        assert values.numel() < 2 or not view.is_contiguous()
        gaps = base[1::2]
        return Placed(view, gaps, gaps.clone())
    raise ValueError(f"unknown layout {layout!r}")
