"""One optimizer step, shared by the training loop and ``benchmarks/step_time.py``; both build
it with :meth:`Stepper.build`, so the optimizer, scheduler and scaler they time are the same.

Order inside a step follows docs/maths.md#masking (the authors' code): backward on every
micro-batch -> unscale -> clip -> optimizer.step -> lr step -> method.after_step(t) (AdaLoRA
scores and masks) -> zero_grad. ``t`` counts optimizer steps from 1, after accumulation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import TrainConfig
from ..methods.allocator import StepReport
from ..methods.base import MethodHandle
from .build import autocast_factory
from .schedule import linear_schedule


@dataclass(frozen=True)
class StepLog:
    """What one optimizer step reports besides its loss."""

    lr: float
    """The learning rate the step used."""
    budget: int | None = None
    """AdaLoRA's total budget b(t) at this step (the cubic schedule of the paper's
    Appendix A, docs/maths.md); None for other methods."""
    ranks: dict[str, int] | None = None
    """Every adapted matrix's rank, when the step changed the mask (a mask event)."""

    @classmethod
    def of(cls, lr: float, report: StepReport | None) -> StepLog:
        """From what a method's ``after_step`` returned (None: nothing to report)."""
        if report is None:
            return cls(lr)
        return cls(lr, int(report.budget), report.ranks)


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

    @classmethod
    def build(cls, model: torch.nn.Module, handle: MethodHandle, train: TrainConfig,
              steps: int, device: torch.device) -> Stepper:
        """AdamW, the linear warm-up/decay over ``steps`` and a GradScaler (enabled for
        fp16 only: bf16 and fp32 need no loss scaling), as ``train`` configures them."""
        autocast, amp_dtype = autocast_factory(train.precision, device)
        # one parameter group, as a plain list gives, but one that may be empty (method none)
        optimizer = torch.optim.AdamW([{"params": handle.trainable}], lr=train.learning_rate,
                                      weight_decay=train.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, linear_schedule(train.warmup_steps, steps))
        scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype is torch.float16)
        return cls(model, handle, optimizer, scheduler, scaler, grad_accum=train.grad_accum,
                   max_grad_norm=train.max_grad_norm, autocast=autocast)

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

    def nonfinite_causes(self) -> str:
        """The likely causes of a NaN or infinite loss that apply to this run, most likely
        first: a half-precision base, fp16 autocast overflowing, then the learning rate."""
        causes = []
        half = sorted({str(p.dtype).removeprefix("torch.") for p in self.model.parameters()
                       if p.dtype in (torch.float16, torch.bfloat16)})
        if half:
            causes.append(f"the model holds {'/'.join(half)} weights (set "
                          "model.base_dtype=fp32)")
        if self.scaler.is_enabled():
            causes.append("fp16 autocast overflowed (set train.precision=bf16 or fp32)")
        learning_rate = self.scheduler.base_lrs[0]  # as configured, before warm-up and decay
        causes.append(f"train.learning_rate={learning_rate:g} is too high (lower it)")
        return "; ".join(causes)

    def update(self, t: int) -> StepLog:
        """Apply the accumulated gradients as optimizer step ``t`` (from 1)."""
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
        log = StepLog.of(lr, after(t)) if after is not None else StepLog(lr)
        opt.zero_grad(set_to_none=True)
        return log
