"""Where a method's parameters live when the model is sharded across processes.

Under FSDP (``engine/sharding.py``) every process holds a slice of rows of each parameter
(its first dimension, split in order). The maths that looks at whole matrices (the rank
allocator's triplet scores, the orthogonal regularizer's Gram matrices) asks a
:class:`Placement` for this process's part and for sums over the processes, so it stays
free of any distributed code; :data:`WHOLE` is the one-process answer, which costs
nothing.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Placement(Protocol):
    """Where the scored parameters live when the model is sharded across processes."""

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This process's part of a parameter or of its gradient (a view: writes land)."""
        ...

    def rows(self, p: torch.Tensor) -> tuple[int, int]:
        """The rows ``[lo, hi)`` of ``p``'s first dimension that this process holds."""
        ...

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the processes, bit for bit the same on every one."""
        ...

    def whole(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The whole tensors of ``params``, differentiably: every process computes the same
        function of them, so the gradient of each flows back to its rows held here."""
        ...


class _Whole:
    """One process holds every parameter whole: the identity placement."""

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def rows(self, p: torch.Tensor) -> tuple[int, int]:
        return 0, p.shape[0]

    def total(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def whole(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return params


WHOLE: Placement = _Whole()
