"""One optimizer step, shared by the training loop and ``benchmarks/step_time.py``; both build
it with :meth:`Stepper.build`, so the optimizer, scheduler and scaler they time are the same.

Order inside a step follows docs/maths.md#masking (the authors' code): backward on every
micro-batch -> unscale -> clip -> optimizer.step -> lr step -> method.after_step(t) (AdaLoRA
scores and masks) -> zero_grad. ``t`` counts optimizer steps from 1, after accumulation.

Under fp16 loss scaling a step whose loss or gradients are not finite is skipped, as the
GradScaler skips it: no optimizer update and nothing fed into AdaLoRA's importance averages,
while ``t`` and both schedules move on; :data:`MAX_SKIPPED` such steps in a row end the run
(docs/training.md#precision). Without loss scaling a non-finite loss ends the run.

No host syncs: a step's loss stays a tensor on the device. Without loss scaling the
finiteness check is a device-side flag too, read by :meth:`Stepper.check_finite` where the
loop reads device values anyway (a logged row, a mask event, an evaluation, a checkpoint),
so between logging steps a step never waits for the GPU (docs/training.md#host-syncs).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import TrainConfig
from ..methods.allocator import StepReport
from ..methods.base import MethodHandle
from .precision import Precision
from .schedule import linear_schedule

MAX_SKIPPED = 20
"""Consecutive steps the fp16 loss scaler may skip before the run stops. Each skip halves
the scale: GradScaler starts at 2**16, and a run whose gradients fit fp16 at all finds its
scale within the first dozen or so skips (a scale of 1 is 16 halvings down), later skips
come one at a time after a growth. Twenty in a row means the scale fell a millionfold below
one that worked: the loss or the weights are NaN, or the model overflows fp16 at any
scale, and no further step will succeed."""


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
    skipped: bool = False
    """The fp16 loss scaler skipped this step (a non-finite loss or gradient): the weights
    and the importance averages are those of the step before."""

    @classmethod
    def of(cls, lr: float, report: StepReport | None, skipped: bool = False) -> StepLog:
        """From what a method's ``after_step`` returned (None: nothing to report)."""
        if report is None:
            return cls(lr, skipped=skipped)
        return cls(lr, int(report.budget), report.ranks, skipped)


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
    precision: str = "fp32"
    """The autocast precision that runs: fp32, bf16 or fp16 (precision.Precision.autocast)."""
    closed_form_reg: bool = False
    """Add the regularizer's gradient in closed form after the backward pass, where the
    regularizer offers it (Eq. 4, AdaLoRA's and LoRA_regu's, on whole factors), instead of
    through autograd. On one GPU: autograd adds each factor's share to its gradient with a
    kernel of its own (hundreds per step at BART-large), the closed form with one fused
    add. Off on the CPU, where the kernels cost nothing extra and the runs stay bit for
    bit as before, and under DDP, whose gradient hooks expect every trained parameter to
    get its gradient inside the backward pass."""
    skipped: int = 0
    """Steps the fp16 loss scaler skipped so far (checkpointed, summed over attempts)."""
    skip_run: int = 0
    """How many of them came last, in a row (checkpointed too)."""
    _bad: tuple[torch.Tensor, torch.Tensor] | None = None
    """(first step whose loss was not finite, 0 for none; its loss), on the device, read by
    :meth:`check_finite` only."""

    @classmethod
    def build(cls, model: torch.nn.Module, handle: MethodHandle, train: TrainConfig,
              steps: int, precision: Precision) -> Stepper:
        """AdamW, the linear warm-up/decay over ``steps`` as ``train`` configures them, and
        a GradScaler on ``precision.device``, enabled for fp16 only (bf16 and fp32 need no
        loss scaling): the autocast and the scaler policy are the build's decision
        (``Built.precision``), never ``train.precision`` read again."""
        device = precision.device
        # one group, or the method's (LoRA+'s faster B, SoRA's gates without weight decay);
        # a group may hold no parameter (method none)
        groups = handle.optimizer_groups(train.learning_rate, train.weight_decay)
        cuda = device.type == "cuda"
        params = [p for g in groups for p in g["params"]]
        # fused on CUDA: one kernel set for all parameters and no per-parameter Python, and
        # under fp16 it skips an overflowed step on the device instead of reading the
        # scaler's flag; the CPU keeps torch's default (its runs stay bit for bit). Plain
        # tensors only: FSDP's sharded parameters keep the default too.
        fused = (cuda and bool(params)
                 and all(type(p) is torch.nn.Parameter for p in params)) or None
        optimizer = torch.optim.AdamW(groups, lr=train.learning_rate,
                                      weight_decay=train.weight_decay, fused=fused)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, linear_schedule(train.warmup_steps, steps))
        scaler = torch.amp.GradScaler(device.type, enabled=precision.loss_scaling)
        return cls(model, handle, optimizer, scheduler, scaler, grad_accum=train.grad_accum,
                   max_grad_norm=train.max_grad_norm, autocast=precision.context(),
                   precision=precision.autocast,
                   closed_form_reg=cuda and not isinstance(
                       model, torch.nn.parallel.DistributedDataParallel))

    def backward(self, batch: dict[str, torch.Tensor], weight: float = 1.0,
                 regularize: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward and backward one micro-batch; returns (task loss, unweighted regularizer),
        both tensors on the device (reading them is the caller's host sync).

        ``weight`` scales this process's share of a distributed micro-batch (see
        distributed.shard) times the piece's share under ``train.length_split`` (split.py);
        the regularizer is the same on every rank and is not scaled. ``regularize=False``
        leaves it out: a batch split into pieces adds it once, with its first piece."""
        handle = self.handle
        with self.autocast():
            loss = self.model(**batch).loss
        rule = handle.regularizer if regularize else None
        closed = (rule is not None and self.closed_form_reg
                  and getattr(rule, "closed_form", False))
        reg = rule() if rule is not None and not closed else None
        scaled = loss * weight if weight != 1.0 else loss
        total = scaled + handle.reg_weight * reg if reg is not None else scaled
        self.scaler.scale(total / self.grad_accum).backward()
        if closed:  # the gradient the loss above would carry, added after the backward
            w = handle.reg_weight / self.grad_accum
            if self.scaler.is_enabled():  # as scaled as the loss's (a device value: no read)
                w = self.scaler.scale(torch.full((), w, device=loss.device))
            reg = rule.add_gradients(w)
        return loss.detach(), reg

    def backward_pieces(self, pieces: list[tuple[dict[str, torch.Tensor], float]],
                        weight: float = 1.0, device: torch.device | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`backward` on each ``(batch, share)`` piece of one micro-batch (split.py);
        returns the micro-batch's mean loss (a float64 0-d tensor on the device) and the
        regularizer, added with piece 0 only.

        The mean is summed in float64 in the order a Python float would be (each piece's
        fp32 loss widened, times its share, added to 0.0), so the value read later is bit
        for bit the one the loop computed on the host before it stopped syncing."""
        loss, reg = None, None
        for j, (batch, share) in enumerate(pieces):
            if device is not None:  # from pinned memory on CUDA (the loop's DataLoader
                # pins): the copy is queued, not waited for (docs/training.md#host-syncs)
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            piece_loss, piece_reg = self.backward(batch, weight * share, regularize=j == 0)
            if loss is None:
                loss = torch.zeros((), dtype=torch.float64, device=piece_loss.device)
            loss = loss + piece_loss.double() * share  # one piece: 0.0 + loss * 1.0
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

    def update(self, t: int, loss: float | torch.Tensor | None = None) -> StepLog:
        """Apply the accumulated gradients as optimizer step ``t`` (from 1).

        ``loss`` is the step's mean loss (None: not checked). Not finite, it ends the run
        without loss scaling: at once for a float, at the next :meth:`check_finite` for a
        tensor (no host sync here). Under fp16 loss scaling it skips the step, as a
        non-finite gradient does, and only :data:`MAX_SKIPPED` skips in a row end the run;
        the scaler reads its own device flags anyway, so the loss is read here too."""
        if isinstance(loss, torch.Tensor):
            if self.scaler.is_enabled():
                loss = float(loss)
            else:
                self._watch(t, loss)
                loss = None
        finite = loss is None or math.isfinite(loss)
        if not finite and not self.scaler.is_enabled():
            raise self._nonfinite(loss, t)
        opt = self.optimizer
        lr = opt.param_groups[0]["lr"]  # the rate this step used
        skipped, scale = self._optimizer_step(finite)
        with warnings.catch_warnings():
            # a skipped first step means the scheduler moves before any optimizer.step();
            # on purpose: t, and so the lr and budget schedules, count every step
            warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"))
            self.scheduler.step()
        after = self.handle.after_step
        report = None
        if after is not None:
            # a skipped step's gradients are not finite: the allocator's importance
            # averages (Eqs. 8-10) skip it too, its schedule and mask events still follow t
            if skipped:
                report = after(t, scored=False)
            elif scale != 1.0:  # gradients a method collected itself are still scaled
                report = after(t, grad_scale=scale)
            else:
                report = after(t)
        opt.zero_grad(set_to_none=True)
        self._count(t, skipped, loss)
        return StepLog.of(lr, report, skipped)

    def _watch(self, t: int, loss: torch.Tensor) -> None:
        """Remember, on the device, the first step whose loss is not finite."""
        if self._bad is None:
            self._bad = (torch.zeros((), dtype=torch.int64, device=loss.device),
                         torch.zeros((), dtype=loss.dtype, device=loss.device))
        first, value = self._bad
        new = (first == 0) & ~torch.isfinite(loss)
        self._bad = (torch.where(new, t, first), torch.where(new, loss, value))

    def check_finite(self) -> None:
        """Raise for the first non-finite loss :meth:`update` saw as a tensor (one host
        sync; the loop calls it where it reads device values anyway)."""
        if self._bad is None:
            return
        first, value = self._bad
        t = int(first)
        if t:
            raise self._nonfinite(float(value), t)

    def _nonfinite(self, loss: float, t: int) -> FloatingPointError:
        return FloatingPointError(f"loss became {loss} at step {t}; likely causes: "
                                  + self.nonfinite_causes())

    def _optimizer_step(self, finite_loss: bool) -> tuple[bool, float]:
        """Unscale, clip and step (the scaler skips the step itself when a gradient is not
        finite); returns whether the step was skipped, and the loss scale its backward used
        (1.0 without fp16 loss scaling)."""
        opt, scaler = self.optimizer, self.scaler
        if not scaler.is_enabled():
            if self.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.handle.trainable, self.max_grad_norm)
            opt.step()
            return False, 1.0
        # Unscale always, not only to clip: the allocator's |w * grad| (Eq. 8) must see
        # true gradients, not ones multiplied by a moving loss scale.
        scaler.unscale_(opt)
        scale = scaler.get_scale()
        if not finite_loss:  # finite gradients under a non-finite loss: skip it all the same
            scaler.update(scale * scaler.get_backoff_factor())
            return True, scale
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.handle.trainable, self.max_grad_norm)
        scaler.step(opt)
        scaler.update()  # backs the scale off exactly when it skipped the step
        return scaler.get_scale() < scale, scale

    def _count(self, t: int, skipped: bool, loss: float | None) -> None:
        """Count a skipped step; :data:`MAX_SKIPPED` in a row end the run."""
        if not skipped:
            self.skip_run = 0
            return
        self.skipped += 1
        self.skip_run += 1
        if self.skip_run >= MAX_SKIPPED:
            last = "" if loss is None else f", last loss {loss:g}"
            raise FloatingPointError(
                f"the fp16 loss scaler skipped {self.skip_run} steps in a row (steps "
                f"{t - self.skip_run + 1}-{t}{last}), each with a non-finite loss or gradient, "
                f"and the loss scale fell to {self.scaler.get_scale():g}; likely causes: "
                + self.nonfinite_causes())
