"""AdaLoRA (Zhang et al., 2023): SVD-based adaptation (Sec. 3.1, Eq. 3), the orthogonal
regularizer (Eq. 4) and the builder, :func:`build_adalora`.

:class:`SVDLinear` wraps a frozen ``nn.Linear`` and adds ``(alpha / r0) * P diag(lam) Q x``.
The rank allocator (``allocator.py``) prunes a matrix's rank by zeroing entries of ``lam``;
``P`` and ``Q`` are never masked and the scaling keeps the *initial* rank ``r0``
(docs/maths.md#svd-adaptation, Eq. (3)).

:func:`orthogonal_regularizer` works on any layer that exposes ``factors() -> (left, right)``
with ``left`` of shape ``(d_out, r)`` and ``right`` of shape ``(r, d_in)``: ``(P, Q)`` here,
``(B, A)`` for LoRA (the LoRA_regu ablation); :class:`OrthogonalRegularizer` is the
method hook that computes it, on whole factors even when the model is sharded.

:func:`low_rank` builds AdaLoRA and LoRA alike: it wraps the targets, adds the regularizer
and, when pruning, the rank allocator (``allocator.py``), so prune-LoRA and LoRA_regu (the
paper's ablations, Tables 5 and 6) take AdaLoRA's budget, schedule, score and regularizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import torch
from torch import nn

from ..config import RunConfig
from .allocator import RankAllocator, check_schedule
from .base import LinearWrapper, MethodHandle, head_parameters, linear_dims, optional_dropout
from .building import adapter_params, check_rank
from .inject import replace_linears, resolve_targets
from .placement import WHOLE, Placement
from .scaled_rank import scaled_rank

RegForm = Literal["code", "paper"]


class SVDLinear(LinearWrapper):
    """``h = W0 x + b + (alpha / r0) * P diag(lam) Q dropout(x)`` around a frozen linear."""

    def __init__(self, base: nn.Module, r0: int, alpha: float, dropout: float = 0.0):
        super().__init__(base)
        self.r0 = r0
        # alpha / r0 with the *initial* rank; it does not follow the pruned rank
        # (docs/maths.md#svd-adaptation).
        self.scaling = alpha / r0
        self.dropout = optional_dropout(dropout)
        w = base.weight  # (d_out, d_in); (d_in, d_out) for a Conv1D
        d_out, d_in = linear_dims(base)
        kw = {"device": w.device, "dtype": torch.float32}  # trained: fp32 whatever the base
        self.P = nn.Parameter(torch.empty(d_out, r0, **kw).normal_(0.0, 0.02))  # (d_out, r0)
        self.lam = nn.Parameter(torch.zeros(r0, **kw))  # (r0,); 0 so Delta W = 0 at step 0
        self.Q = nn.Parameter(torch.empty(r0, d_in, **kw).normal_(0.0, 0.02))  # (r0, d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Eq. 3, applied right to left so no (d_out, d_in) matrix is ever formed.
        # diag(lam) in one autograd function under autocast (scaled_rank.py: fewer kernels,
        # the same arithmetic)
        z = scaled_rank(self.dropout(x) @ self.Q.T, self.lam)  # (..., r0)
        return self.base(x) + (z @ self.P.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``Delta W = (alpha / r0) P diag(lam) Q``, shape ``(d_out, d_in)`` (for inspection)."""
        return (self.P * self.lam) @ self.Q * self.scaling

    def adapter_parameters(self) -> Iterator[nn.Parameter]:
        yield from (self.P, self.lam, self.Q)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.P, self.Q

    def triplet_factors(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(P, lam, Q)``: triplet ``i`` is ``(P[:, i], lam[i], Q[i, :])``."""
        return self.P, self.lam, self.Q

    def extra_repr(self) -> str:
        return f"r0={self.r0}, scaling={self.scaling:g}"


def _tall_groups(factors: list[torch.Tensor]) -> dict[tuple[int, int], list[int]]:
    """The factors' indices grouped by the shape of their tall ``(d, r)`` form, in order.

    ``factors`` alternates left ``(d_out, r)`` and right ``(r, d_in)``; ``R R^T`` is the Gram
    matrix of ``R^T``'s columns, so every factor is handled as a tall matrix ``M`` (a left
    one as it is, a right one transposed) with Gram ``M^T M``."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, f in enumerate(factors):
        groups.setdefault(tuple(f.shape if i % 2 == 0 else f.T.shape), []).append(i)
    return groups


def _tall(factors: list[torch.Tensor], i: int) -> torch.Tensor:
    return factors[i] if i % 2 == 0 else factors[i].T


def _gram_residuals(factors: list[torch.Tensor]
                    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Per shape group: the factors' indices, their tall forms stacked ``(g, d, r)``, and
    ``E = M^T M - I`` for each ``(g, r, r)``, from one batched matmul."""
    for (_, r), members in _tall_groups(factors).items():
        stack = torch.stack([_tall(factors, i) for i in members])  # (g, d, r)
        gram = stack.transpose(1, 2) @ stack  # (g, r, r)
        yield members, stack, gram - torch.eye(r, device=stack.device, dtype=stack.dtype)


def _gram_distances(layers: Iterable[nn.Module], placement: Placement = WHOLE) -> torch.Tensor:
    """``||L^T L - I||_F`` and ``||R R^T - I||_F`` of every layer, as one ``(2n,)`` tensor.

    Factors of equal shape are stacked and multiplied in one batched matmul: a few kernels
    per step instead of four per matrix, which is what keeps AdaLoRA's step as cheap as
    LoRA's. The order of the entries is by shape group; the regularizer only sums or
    averages them.
    """
    factors = placement.whole([f for layer in layers for f in layer.factors()])
    return torch.cat([torch.linalg.matrix_norm(e) for _, _, e in _gram_residuals(factors)])


@torch.no_grad()
def orthogonal_regularizer_grads(layers: Iterable[nn.Module], form: RegForm = "code",
                                 weight: float | torch.Tensor = 1.0
                                 ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Eq. 4 and the gradient of ``weight`` times it by every factor, in closed form.

    Returns ``(R, factors, grads)``: ``R`` bit for bit :func:`orthogonal_regularizer`'s value
    (the same stacked products, in the same order), and ``grads[k]`` shaped like
    ``factors[k]``. With ``E = M^T M - I`` (symmetric) and ``f = ||E||_F``, ``df/dM = 2 M E
    / f``, so the ``code`` form's ``mean(f)`` over the ``N`` factors has gradient ``2 M E /
    (N f)`` and the ``paper`` form's ``sum(f^2)`` has ``4 M E``
    (docs/maths.md#orthogonal-regularizer-gradient). The engine adds these to the factors'
    gradients in one fused add on CUDA, where autograd would accumulate each factor's share
    with a kernel of its own.
    ``weight`` may be a 0-d tensor (gamma times a loss scale), so no value is read."""
    if form not in ("code", "paper"):
        raise ValueError(f"unknown orthogonal regularizer form {form!r}; use 'code' or 'paper'")
    factors = [f for layer in layers for f in layer.factors()]
    grads: list[torch.Tensor | None] = [None] * len(factors)
    norms = []
    for members, stack, e in _gram_residuals(factors):
        f = torch.linalg.matrix_norm(e)  # (g,)
        norms.append(f)
        # E = 0 gives a zero gradient whatever the divisor; the clamp only avoids 0 / 0
        coef = ((2.0 / len(factors)) / f.clamp_min(1e-30) if form == "code"
                else torch.full_like(f, 4.0))  # (g,)
        scale = (coef * weight).view(-1, 1, 1)
        # laid out as the factors are (a right factor's (M E)^T = E M^T, E symmetric), so
        # the gradients' strides match theirs and one fused add takes them all
        tall = (stack @ e) * scale if any(i % 2 == 0 for i in members) else None  # (g, d, r)
        wide = (e @ stack.mT) * scale if any(i % 2 for i in members) else None  # (g, r, d)
        for k, i in enumerate(members):
            grads[i] = tall[k] if i % 2 == 0 else wide[k]
    norms_all = torch.cat(norms)
    value = norms_all.mean() if form == "code" else norms_all.pow(2).sum()
    return value, factors, grads  # type: ignore[return-value]


def orthogonal_regularizer(layers: Iterable[nn.Module], form: RegForm = "code",
                           placement: Placement = WHOLE) -> torch.Tensor:
    """Eq. 4 summed or averaged over the adapted matrices (docs/maths.md#orthogonal-regularizer).

    ``code``: mean of the *unsquared* Frobenius norms over the list of all 2n factors (the
    form the paper's gamma values were tuned with). ``paper``: sum of the squared norms.
    ``placement``: where the factors live when the model is sharded (methods/placement.py).
    """
    norms = _gram_distances(layers, placement)  # (2n,)
    if form == "code":
        return norms.mean()
    if form == "paper":
        return norms.pow(2).sum()
    raise ValueError(f"unknown orthogonal regularizer form {form!r}; use 'code' or 'paper'")


class OrthogonalRegularizer:
    """A method's ``regularizer`` hook: Eq. 4 over its adapted layers. When the model is
    sharded, :meth:`place` makes it gather the whole factors first, so its value and
    gradient are those of the unsharded model."""

    def __init__(self, layers: Iterable[nn.Module], form: RegForm = "code"):
        self.layers, self.form, self.placement = list(layers), form, WHOLE

    def place(self, placement: Placement) -> None:
        self.placement = placement

    def __call__(self) -> torch.Tensor:
        return orthogonal_regularizer(self.layers, self.form, self.placement)

    @property
    def closed_form(self) -> bool:
        """Whether :meth:`add_gradients` applies: the factors are whole on this process."""
        return self.placement is WHOLE

    def add_gradients(self, weight: float | torch.Tensor) -> torch.Tensor:
        """Add ``weight`` times Eq. 4's gradient to the factors' ``.grad`` (after the
        backward pass, in one fused add) and return the unweighted value, detached: the
        same update autograd makes from ``weight * self()`` in the loss, to rounding."""
        value, factors, grads = orthogonal_regularizer_grads(self.layers, self.form, weight)
        into, adds = [], []
        for f, g in zip(factors, grads):  # one pass: this runs every step
            if not f.requires_grad:  # a frozen factor gets no gradient, as under autograd
                continue
            if f.grad is None:  # a factor the forward pass did not use has none yet
                f.grad = torch.zeros_like(f)
            into.append(f.grad)
            adds.append(g)
        if adds:
            torch._foreach_add_(into, adds)
        return value


def low_rank(model: nn.Module, cfg: RunConfig, total_steps: int | None, *, rank: int,
             rank_key: str, gamma: float, prune: bool,
             wrap: Callable[[nn.Module], nn.Module]) -> MethodHandle:
    """Shared by AdaLoRA and LoRA: inject, regularizer, and the allocator when pruning.

    Pruning (AdaLoRA, or prune-LoRA) takes its budget, schedule and score from
    ``cfg.adalora``; the regularizer form too (LoRA_regu uses the same Eq. 4)."""
    paths = resolve_targets(model, cfg.method.target_modules)
    check_rank(model, paths, rank, rank_key)
    pruning = prune and total_steps is not None
    a = cfg.adalora.resolved(len(paths))  # b(T) for these n matrices
    if pruning:  # reject an impossible schedule before touching the model
        check_schedule(len(paths) * rank, a.budget, a.t_init, a.t_final, total_steps)
    layers = replace_linears(model, paths, wrap)
    modules = [layer for _, layer in layers]
    regularizer = OrthogonalRegularizer(modules, a.orth_reg) if gamma > 0 else None
    allocator = RankAllocator.from_config(layers, a, total_steps) if pruning else None
    return MethodHandle(
        name=cfg.method.name, adapter=adapter_params(layers), head=head_parameters(model),
        n_matrices=len(layers), reg_weight=gamma, regularizer=regularizer,
        after_step=allocator.step if allocator else None,
        allocator=allocator, layers=layers,
    )


def build_adalora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    a = cfg.adalora
    return low_rank(model, cfg, total_steps, rank=a.init_rank, rank_key="adalora.init_rank",
                    gamma=a.gamma, prune=a.prune,
                    wrap=lambda lin: SVDLinear(lin, a.init_rank, a.alpha, a.dropout))
