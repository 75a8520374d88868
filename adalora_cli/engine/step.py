"""One optimizer step, shared by the training loop and ``benchmarks/step_time.py``.

Order inside a step follows SPEC section 5 (the authors' code): backward on every
micro-batch -> unscale -> clip -> optimizer.step -> lr step -> method.after_step(t) (AdaLoRA
scores and masks) -> zero_grad. ``t`` counts optimizer steps from 1, after accumulation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..methods.base import MethodHandle


@dataclass
class Stepper:
    """The pieces one optimizer step touches, built once per run."""

    model: torch.nn.Module
    handle: MethodHandle
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    autocast: Callable[[], Any] = contextlib.nullcontext

    def backward(self, batch: dict[str, torch.Tensor], weight: float = 1.0,
                 regularize: bool = True) -> tuple[float, torch.Tensor | None]:
        """Forward and backward one micro-batch; returns (task loss, unweighted regularizer).

        ``weight`` scales this process's share of a distributed micro-batch (see
        distributed.shard) times the piece's share under ``train.length_split`` (split.py);
        the regularizer is the same on every rank and is not scaled. ``regularize=False``
        leaves it out: a batch split into pieces adds it once, with its first piece."""
        handle = self.handle
        with self.autocast():
            loss = self.model(**batch).loss
        reg = handle.regularizer() if handle.regularizer is not None and regularize else None
        scaled = loss * weight if weight != 1.0 else loss
        total = scaled + handle.reg_weight * reg if reg is not None else scaled
        self.scaler.scale(total / self.grad_accum).backward()
        return float(loss.detach()), reg

    def backward_pieces(self, pieces: list[tuple[dict[str, torch.Tensor], float]],
                        weight: float = 1.0, device: torch.device | None = None
                        ) -> tuple[float, torch.Tensor | None]:
        """:meth:`backward` on each ``(batch, share)`` piece of one micro-batch (split.py);
        returns the micro-batch's mean loss and the regularizer, added with piece 0 only."""
        loss, reg = 0.0, None
        for j, (batch, share) in enumerate(pieces):
            if device is not None:
                batch = {k: v.to(device) for k, v in batch.items()}
            piece_loss, piece_reg = self.backward(batch, weight * share, regularize=j == 0)
            loss += share * piece_loss  # one piece: 0.0 + 1.0 * loss, exactly the loss
            if j == 0:
                reg = piece_reg
        return loss, reg

    def update(self, t: int) -> tuple[float, dict[str, Any]]:
        """Apply the accumulated gradients as optimizer step ``t`` (from 1).

        Returns the learning rate the step used and what the method's after-step logged."""
        opt = self.optimizer
        if self.scaler.is_enabled():
            # Unscale always, not only to clip: the allocator's |w * grad| (Eq. 8) must see
            # true gradients, not ones multiplied by a moving loss scale.
            self.scaler.unscale_(opt)
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.handle.trainable, self.max_grad_norm)
        lr = opt.param_groups[0]["lr"]  # the rate this step used
        self.scaler.step(opt)
        self.scaler.update()
        self.scheduler.step()
        after = self.handle.after_step
        logs = after(t) if after is not None else {}
        opt.zero_grad(set_to_none=True)
        return lr, logs
