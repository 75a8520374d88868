"""GoRA (He et al., 2025; arXiv 2502.12171): LoRA whose ranks and initial factors come from
the gradients of the frozen weights, gathered over the first batches before training
(docs/maths.md#gora); :func:`build_gora` is its builder.

With ``G_i`` the mean gradient of the frozen ``W_i`` (``d_out x d_in``) over the pass's
batches, the maths implemented here, in the paper's order (Sec. 3):

- importance, the paper's sensitivity score: ``I_i = mean(|W_i * G_i|)`` (elementwise
  product, averaged over the matrix's entries), normalised to ``a_i = I_i / sum_j I_j``;
- ranks in proportion under the budget: the parameter budget of LoRA at the mean rank ``r``,
  ``P = r * sum_j (d_in_j + d_out_j)``, is split by importance,
  ``r_i = clip(round(P a_i / (d_in_i + d_out_i)), r_min, r_max)``;
- initialisation: ``A_i`` random (Kaiming-uniform, as LoRA's), and ``B_i`` the least-squares
  solution of ``B A_i = G_i`` (``G_i A_i^+ = G_i A_i^T (A_i A_i^T)^-1``), scaled so that the
  adapter's first output is a gradient step of size ``gamma``:
  ``s B_i A_i = -gamma sqrt(d_in_i / r_i) G_i A_i^+ A_i``. ``A_i^+ A_i`` projects onto
  ``r_i`` random directions of ``d_in_i``, which keep ``r_i / d_in_i`` of ``G_i``'s energy
  in expectation; ``sqrt(d_in_i / r_i)`` gives the step its full size back.

The adapter then trains as a plain LoRA, ``h = W0 x + s B A x`` with ``s = alpha / r`` (the
mean rank) in every matrix. The base is never rewritten: the adapter's first output is the
gradient step, as the paper intends.

Choices where the paper leaves room, and what we compared against the authors' code
(hhnqqq/MyTransformers, ``common/lora_modules/gora.py``, read, not copied):

- The rank is rounded to the nearest integer; the authors' code rounds the parameter count
  ``P a_i`` and then floor-divides it by ``d_in + d_out``, which can only give fewer ranks.
- The sign: ``B`` starts at ``-G A^+`` (a descent step, as the paper writes it); the authors'
  code stores ``+G A^+`` and compares the result against ``-lr G``.
- The scale: ``sqrt(d_in / r_i) gamma`` is the authors' ``scaling_by_lr`` form with
  ``gamma`` in place of its learning rate; their default instead multiplies ``G A^+`` by a
  fixed ``stable_gamma / alpha``. Their code also adds ``1e-8 I`` to ``A A^T`` before the
  pseudo-inverse; we solve the least-squares problem directly in float64.
- ``s = alpha / r`` with the mean rank ``r``, as the authors' default (not ``alpha / r_i``).
- Importance with the authors' default ``union_mean`` type (the paper's ``avg(|W * G|)``),
  normalised by the sum (no softmax).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..config import ConfigError, GoRAConfig, RunConfig
from .base import MethodHandle, is_transposed
from .building import check_rank, fixed_rank
from .inject import replace_linears, resolve_targets
from .lora import LoRALinear

# --------------------------------------------------------------------------- the maths


def importance(W: torch.Tensor, G: torch.Tensor) -> float:
    """``I = mean(|W * G|)``, the paper's sensitivity score of one matrix (same layout for
    both: the score does not depend on it)."""
    return (W.double() * G.double()).abs().mean().item()


def allocate_ranks(scores: Mapping[str, float], dims: Mapping[str, tuple[int, int]], r: int,
                   r_min: int, r_max: int) -> dict[str, int]:
    """Rank of every matrix: ``clip(round(P a_i / (d_in_i + d_out_i)), r_min, r_max)``
    (and at most ``min(d_out_i, d_in_i)``) with
    ``P = r sum_j (d_in_j + d_out_j)`` and ``a_i = I_i / sum_j I_j``. ``dims[name]`` is
    ``(d_out, d_in)``. All scores zero (no gradient reached any matrix) shares P evenly."""
    total = sum(scores.values())
    n = len(scores)
    budget = r * sum(d_out + d_in for d_out, d_in in dims.values())  # P
    out = {}
    for name, score in scores.items():
        share = score / total if total > 0 else 1.0 / n  # a_i
        d_out, d_in = dims[name]
        ideal = budget * share / (d_out + d_in)
        # a rank above the matrix's smaller side adds nothing it could use
        out[name] = min(r_max, d_out, d_in, max(r_min, math.floor(ideal + 0.5)))
    return out


def random_A(rank: int, d_in: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(rank, d_in)`` uniform on ``[-1/sqrt(d_in), 1/sqrt(d_in)]``: LoRA's A, the bound
    ``kaiming_uniform_(a=sqrt(5))`` gives a fan-in of ``d_in``."""
    u = torch.rand(rank, d_in, generator=generator, dtype=torch.float64)
    return ((2 * u - 1) / math.sqrt(d_in)).float()


def initial_B(G: torch.Tensor, A: torch.Tensor, scaling: float, gamma: float) -> torch.Tensor:
    """``B0 = -(gamma / s) sqrt(d_in / r) G A^+``, shape ``(d_out, r)``, with ``G`` as
    ``(d_out, d_in)`` and ``A`` as ``(r, d_in)``: ``s B0 A`` is the step
    ``-gamma sqrt(d_in / r) G A^+ A``. ``G A^+`` is the least-squares solution of
    ``B A = G``, solved in float64."""
    r, d_in = A.shape
    A64, G64 = A.double(), G.double()
    GA_pinv = torch.linalg.lstsq(A64.T, G64.T).solution.T  # (d_out, r): argmin |B A - G|
    return (-(gamma / scaling) * math.sqrt(d_in / r) * GA_pinv).float()


@dataclass
class GoRAPlan:
    """What the pass decided for every adapted matrix, by module path."""

    importance: dict[str, float]
    """``I_i = mean(|W_i * G_i|)``."""
    share: dict[str, float]
    """``a_i = I_i / sum_j I_j``."""
    ranks: dict[str, int]
    """``r_i``, within ``[r_min, r_max]``."""
    A: dict[str, torch.Tensor]
    """``(r_i, d_in)``, random."""
    B: dict[str, torch.Tensor]
    """``(d_out, r_i)``, from the gradient."""


def plan(weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
         cfg: GoRAConfig, generator: torch.Generator | None = None) -> GoRAPlan:
    """Importance, ranks and initial factors of every matrix from its weight and its mean
    gradient, both ``(d_out, d_in)`` (``nn.Linear``'s layout), in the order of ``weights``.
    ``A`` is drawn in that order from ``generator`` (the global RNG when None)."""
    if set(grads) != set(weights):
        raise ValueError(f"gradients for {sorted(grads)} but weights for {sorted(weights)}")
    scores = {name: importance(W, grads[name]) for name, W in weights.items()}
    total = sum(scores.values())
    share = {name: (s / total if total > 0 else 1.0 / len(scores)) for name, s in scores.items()}
    dims = {name: tuple(W.shape) for name, W in weights.items()}
    r_min, r_max = cfg.bounds()
    ranks = allocate_ranks(scores, dims, cfg.r, r_min, r_max)
    scaling = cfg.scaling
    A, B = {}, {}
    for name, W in weights.items():
        A[name] = random_A(ranks[name], W.shape[1], generator)
        B[name] = initial_B(grads[name], A[name].to(grads[name].device), scaling,
                            cfg.init_scale)
    return GoRAPlan(scores, share, ranks, A, B)


# --------------------------------------------------------------------------- the layer


class GoRALinear(LoRALinear):
    """LoRA scaled by ``alpha / r`` with the mean rank r, whatever its own rank: built at
    ``rank`` with LoRA's start, then :meth:`reset` to the rank and factors of the pass."""

    def __init__(self, base: nn.Module, rank: int, mean_rank: int, alpha: float,
                 dropout: float = 0.0):
        super().__init__(base, rank, alpha, dropout)
        self.mean_rank = mean_rank
        self.scaling = alpha / mean_rank  # the same s in every matrix, whatever its rank

    def reset(self, rank: int, A: torch.Tensor, B: torch.Tensor) -> None:
        """This matrix at ``rank``, starting from ``A`` ``(rank, d_in)`` and ``B``
        ``(d_out, rank)`` (new fp32 parameters; the scale keeps the mean rank)."""
        kw = {"device": self.A.device, "dtype": torch.float32}
        self.r = rank
        # row-major, as a checkpoint's factors load (lstsq's solution comes transposed):
        # a matmul over other strides rounds differently, and a resume would drift
        self.A = nn.Parameter(A.to(**kw).clone(memory_format=torch.contiguous_format))
        self.B = nn.Parameter(B.to(**kw).clone(memory_format=torch.contiguous_format))

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, gradient init"


class GoRAPass:
    """GoRA's pass before training (adalora_cli/engine/calibration.py runs it): the mean
    gradient of every adapted matrix's frozen weight over the first ``gora.n_batches``
    batches, summed across processes, then :func:`plan` sets each matrix's rank and
    factors. Every process draws ``A`` from the same seed and sees the same summed
    gradients, so every process chooses the same ranks and factors."""

    title = "GoRA gradient pass"
    needs_grad = True

    def __init__(self, layers: list[tuple[str, GoRALinear]], cfg: GoRAConfig, seed: int):
        self.layers, self.cfg, self.seed = layers, cfg, seed
        self.n_batches = cfg.n_batches
        self.seen = 0
        self.sums: dict[str, torch.Tensor] = {}
        self._ranks: dict[str, int] = {}

    def begin(self, model: nn.Module, collective) -> None:
        self.collective = collective
        self._before = {p: m.base.weight.requires_grad for p, m in self.layers}
        for p, m in self.layers:
            m.base.weight.requires_grad_(True)  # only for the pass: G of the frozen W0
            self.sums[p] = torch.zeros(m.base.weight.shape, dtype=torch.float32,
                                       device=m.base.weight.device)

    def inputs(self, batch: dict[str, torch.Tensor]) -> None:
        pass

    def observe(self) -> bool:
        for p, m in self.layers:
            w = m.base.weight
            if w.grad is not None:
                self.sums[p] += w.grad.float()
                w.grad = None
        self.seen += 1
        return False

    def end(self, model: nn.Module) -> dict[str, int]:
        grads, weights = {}, {}
        for p, m in self.layers:
            m.base.weight.requires_grad_(self._before[p])
            m.base.weight.grad = None
            G = self.collective.sum(self.sums.pop(p)) / max(self.seen, 1)  # mean gradient
            grads[p] = G.T if m.fan_in_fan_out else G  # (d_out, d_in)
            weights[p] = _weight(m.base)
        decided = plan(weights, grads, self.cfg, torch.Generator().manual_seed(self.seed))
        for p, m in self.layers:
            m.reset(decided.ranks[p], decided.A[p], decided.B[p])
        self._ranks = dict(decided.ranks)
        return dict(self._ranks)

    def restore(self, shapes: dict[str, torch.Size]) -> dict[str, int]:
        ranks = {}
        for p, m in self.layers:
            r = shapes[f"{p}.A"][0]
            m.reset(r, torch.zeros(r, m.in_features), torch.zeros(m.out_features, r))
            ranks[p] = r
        self._ranks = ranks
        return dict(ranks)

    def summary(self) -> str:
        ranks = list(self._ranks.values())
        where = f"from {self.seen} batches" if self.seen else "as the checkpoint holds them"
        return (f"GoRA: ranks {min(ranks)} to {max(ranks)} over {len(ranks)} matrices, "
                f"{sum(ranks)} in all (mean rank {self.cfg.r}), {where}")


def build_gora(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    """GoRA on ``model``: every matrix at the mean rank ``gora.r`` with LoRA's start until
    its pass (:class:`GoRAPass`) sets ranks and factors from the gradients; a dry run,
    which reads no data, counts that uniform rank, the budget GoRA spends before
    rounding and clipping."""
    go = cfg.gora
    if cfg.model.quantize != "none":  # a 4-bit weight takes no gradient: its G would be 0
        raise ConfigError(f"gora reads the gradients of the frozen weights, which a "
                          f"model.quantize={cfg.model.quantize} base does not give; train "
                          "GoRA on an unquantized base (model.quantize=none)")
    paths = resolve_targets(model, cfg.method.target_modules)
    check_rank(model, paths, go.r, "gora.r")
    layers = replace_linears(model, paths, lambda lin: GoRALinear(
        lin, go.r, go.r, go.alpha, go.dropout))
    return fixed_rank(model, cfg, layers, calibration=GoRAPass(layers, go, cfg.train.seed))


def _weight(module: nn.Module) -> torch.Tensor:
    """A linear's weight in ``(d_out, d_in)`` layout."""
    w = module.weight.detach()
    return w.T if is_transposed(module) else w

