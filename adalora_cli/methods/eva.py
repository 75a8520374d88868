"""EVA, Explained Variance Adaptation (Paischer et al., 2025; arXiv 2410.07170;
docs/maths.md#eva): a LoRA whose ranks and initial ``A`` come from the data, before training.

Before the first step, the engine runs the first training batches through the frozen model
(adalora_cli/engine/calibration.py) and :class:`EVAPass` fits, for every adapted layer, an
incremental PCA of the layer's inputs ``x`` (the tokens the attention mask, and a causal
LM's labels, keep; centred), one update per batch (the paper's Algorithm 1, after Ross et
al., 2008). It keeps ``k = round(rho * r)`` components per layer; a layer's fit stops once
each of the components its current rank uses has cosine similarity at least ``tau`` with
the previous batch's. After every batch the total rank budget ``b`` (``n * r``, or
``eva.budget``) is redistributed: the ``b`` largest explained-variance ratios over all layers'
components win, so a layer gets between 0 and ``k`` ranks. Then each layer's ``A`` starts as
its top right-singular vectors, ``B`` at zero (``Delta W = 0`` at step 0), and it trains as a
plain LoRA at that rank. Layers that see the same input (BERT's query, key and value) share
one fit, as they would compute the same one.

SVD conventions (what the fidelity test against PEFT relies on): singular values descend;
each right-singular vector's sign is chosen so that its entry of largest magnitude is
positive (scikit-learn's ``svd_flip`` on V), so the same data give the same ``A`` on every
device; the SVD runs in float64.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError, EVAConfig, RunConfig
from .base import MethodHandle, linear_dims
from .building import Layers, fixed_rank, inject
from .lora import LoRALinear


class EVALinear(LoRALinear):
    """LoRA whose rank and ``A`` are set once by the pass before training."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0,
                 adjust_scaling: bool = True):
        super().__init__(base, r, alpha, dropout)
        self.mean_rank, self.adjust_scaling = r, adjust_scaling

    def set_rank(self, rank: int, a0: torch.Tensor | None = None) -> None:
        """New ``A`` (``a0``, shape ``(rank, d_in)``; zeros when None: a checkpoint fills
        it) and ``B = 0`` at ``rank``. PEFT scales a layer's alpha by rank / r when it
        adjusts the scaling factors, so s = alpha / r stays the same on every layer."""
        device = self.A.device
        d_out, d_in = linear_dims(self.base)
        self.r = rank
        self.scaling = (self.alpha / self.mean_rank if self.adjust_scaling or rank == 0
                        else self.alpha / rank)
        a = (torch.zeros(rank, d_in) if a0 is None else a0.detach())
        # row-major, as a checkpoint's A loads: the SVD's Vh comes column-major, and a
        # matmul over other strides rounds differently, so a resumed run would drift
        self.A = nn.Parameter(a.to(device=device, dtype=torch.float32)
                              .clone(memory_format=torch.contiguous_format))
        self.B = nn.Parameter(torch.zeros(d_out, rank, device=device, dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, EVA init"


def _flip_signs(vh: torch.Tensor) -> torch.Tensor:
    """Each row's sign so that its entry of largest magnitude is positive."""
    biggest = vh.abs().argmax(dim=1)
    signs = torch.sign(vh[torch.arange(vh.shape[0]), biggest])
    signs[signs == 0] = 1
    return vh * signs.unsqueeze(1)


class InputPCA:
    """Incremental PCA of one layer's inputs: the top ``k`` right-singular vectors ``V``
    and singular values ``S`` of all rows seen so far, centred on their running mean.

    An update stacks ``diag(S) V`` (the rows so far, compressed), the new rows centred on
    their own mean, and one row ``sqrt(n m / (n + m)) (mean - batch mean)`` that moves the
    old rows to the new mean, and takes the SVD of the stack. The explained-variance ratio
    of component i is ``S_i^2 / sum_j ss_j``, with ``ss`` each feature's running sum of
    squared deviations (exact, not the kept components' sum)."""

    def __init__(self, k: int):
        self.k = k
        self.n = 0
        self.mean: torch.Tensor | None = None  # (d,) float64
        self.ss: torch.Tensor | None = None  # (d,) float64: sum of squared deviations
        self.S: torch.Tensor | None = None  # (k,)
        self.V: torch.Tensor | None = None  # (k, d)
        self.ratio: torch.Tensor | None = None  # (k,)
        self.converged = torch.zeros(k, dtype=torch.bool)

    @property
    def fitted(self) -> bool:
        return self.V is not None

    @torch.no_grad()
    def update(self, x: torch.Tensor, tau: float) -> bool:
        """Fit the rows ``x`` (m, d); False (nothing fitted) when m < k."""
        m = x.shape[0]
        if m < self.k:
            return False
        x = x.double()
        batch_mean = x.mean(dim=0)
        centred = x - batch_mean
        batch_ss = centred.square().sum(dim=0)
        if self.n == 0:
            n_new, mean, ss = m, batch_mean, batch_ss
            stack = centred
        else:
            n_new = self.n + m
            mean = (self.n * self.mean + m * batch_mean) / n_new
            shift = self.mean - batch_mean
            ss = self.ss + batch_ss + (self.n * m / n_new) * shift.square()
            correction = ((self.n * m / n_new) ** 0.5) * shift
            stack = torch.cat([self.S.unsqueeze(1) * self.V, centred, correction[None]])
        _, s, vh = torch.linalg.svd(stack, full_matrices=False)
        vh = _flip_signs(vh)
        previous = self.V
        self.n, self.mean, self.ss = n_new, mean, ss
        self.S, self.V = s[:self.k], vh[:self.k]
        self.ratio = s[:self.k].square() / ss.sum()
        if previous is not None:
            cos = torch.nn.functional.cosine_similarity(self.V, previous, dim=1)
            self.converged = (cos >= tau).cpu()
        return True


def distribute(ratios: list[torch.Tensor], budget: int) -> list[int]:
    """Ranks per entry: the ``budget`` largest values over all entries' ratios win. Ties
    go to the earlier entry (a stable sort), so layers sharing one fit, listed after the
    fits' owners, never get more than their owner."""
    owner = torch.cat([torch.full((len(r),), i, dtype=torch.long)
                       for i, r in enumerate(ratios)])
    values = torch.cat([r.double().cpu() for r in ratios])
    top = torch.sort(values, descending=True, stable=True).indices[:budget]
    counts = torch.bincount(owner[top], minlength=len(ratios))
    return [int(c) for c in counts]


class EVAPass:
    """EVA's side of the pass before training (engine/calibration.py)."""

    title = "EVA: incremental SVD of the adapted layers' inputs"
    needs_grad = False

    def __init__(self, layers: Layers, ev: EVAConfig, budget: int):
        self.layers, self.ev, self.budget = layers, ev, budget
        self.n_batches = ev.n_batches
        # a layer's components are d_in-vectors: it cannot keep more than d_in of them
        self.k = {path: min(round(ev.r * ev.rho), linear_dims(layer.base)[1])
                  for path, layer in layers}
        self.owner: dict[str, str] = {}  # layer -> the layer whose fit it shares
        self.fits: dict[str, InputPCA] = {}
        self.ranks = dict(self.k)  # while no redistribution yet: every kept component
        self.active: dict[str, bool] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.masks: list[torch.Tensor] = []
        self.batches = 0
        self.hooks: list = []
        self.collective = None
        self.restored = False

    # ---------------------------------------------------------------- engine side

    def begin(self, model: nn.Module, collective) -> None:
        self.collective = collective
        for path, layer in self.layers:
            self.rows[path] = []
            self.hooks.append(layer.register_forward_hook(self._hook(path)))

    def _hook(self, path: str):
        def hook(module, args, output):
            if self.batches > 0 and (self.owner[path] != path or not self.active[path]):
                return  # it shares another layer's fit, or its fit converged
            x = args[0]
            # the first mask of the input's shape: the encoder's (or a decoder-only
            # model's) tokens, else an encoder-decoder's decoder positions
            mask = next((m for m in self.masks if x.shape[:-1] == m.shape), None)
            if mask is not None:
                x = x[mask]
            self.rows[path].append(x.reshape(-1, x.shape[-1]).detach().float())
        return hook

    def inputs(self, batch: dict[str, torch.Tensor]) -> None:
        """The tokens whose rows the SVD sees: those the attention mask keeps and, for a
        causal LM, whose labels are not ignored (-100: the prompt, with
        eva.use_label_mask); in an encoder-decoder's decoder, the positions the decoder
        mask keeps, or whose labels are not ignored."""
        ids = batch.get("input_ids")
        mask = batch.get("attention_mask")
        mask = (mask.bool() if mask is not None
                else torch.ones_like(ids, dtype=torch.bool) if ids is not None else None)
        labels = batch.get("labels")
        tokens = labels is not None and labels.ndim == 2  # per-token labels
        if (mask is not None and self.ev.use_label_mask and tokens
                and labels.shape == mask.shape):  # a causal LM's: its ignored prompt tokens
            mask = mask & (labels != -100)
        masks = [mask] if mask is not None else []
        decoder = batch.get("decoder_attention_mask")
        if decoder is not None:
            masks.append(decoder.bool())
        elif tokens and (mask is None or labels.shape != mask.shape):
            masks.append(labels != -100)  # the decoder's positions that predict a token
        self.masks = masks

    def observe(self) -> bool:
        # every process gathers the same layers' rows, in the same order, whether or not
        # it ran a forward of its own (a process with no share of a short last batch)
        layers = dict(self.layers)
        wanted = ([path for path, _ in self.layers] if self.batches == 0 else
                  [o for o in self.fits if self.active[o]])
        rows = {}
        for path in wanted:
            pieces = self.rows[path]
            like = layers[path].A
            local = (torch.cat(pieces) if pieces else
                     like.new_zeros((0, linear_dims(layers[path].base)[1])))
            rows[path] = self.collective.cat(local)
        for path in self.rows:
            self.rows[path] = []
        if self.batches == 0:
            self._share(rows)
        self.batches += 1
        for owner, fit in self.fits.items():
            if self.active[owner]:
                fit.update(rows[owner], self.ev.tau)
        if all(fit.fitted for fit in self.fits.values()):
            self.ranks = self._distribute()
        # a fit that converged on the components its layers now use stops; one whose
        # layers were given more components than have converged starts again
        for owner, fit in self.fits.items():
            self.active[owner] = not bool(fit.converged[:self._owner_rank(owner)].all())
        return not any(self.active.values())

    def end(self, model: nn.Module) -> dict[str, int]:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        missing = [o for o, f in self.fits.items() if not f.fitted]
        if missing or not self.fits:
            k = self.k[missing[0]] if missing else 0
            raise ConfigError(
                f"EVA: layer {missing[0] if missing else '?'} never saw {k} tokens in one "
                f"batch, so its SVD could not start; raise train.batch_size or lower eva.r "
                f"or eva.rho")
        for path, layer in self.layers:
            fit = self.fits[self.owner[path]]
            rank = self.ranks[path]
            a0 = fit.V[:rank]
            if self.ev.whiten:
                a0 = a0 / fit.S[:rank].sqrt().unsqueeze(1)
            layer.set_rank(rank, a0)
        return dict(self.ranks)

    def restore(self, shapes: dict[str, torch.Size]) -> dict[str, int]:
        for path, layer in self.layers:
            shape = shapes.get(f"{path}.A")
            if shape is None:
                raise ValueError(f"the checkpoint holds no {path}.A: it was written for "
                                 "another model or method")
            layer.set_rank(int(shape[0]))
        self.ranks = {path: layer.r for path, layer in self.layers}
        self.restored = True
        return dict(self.ranks)

    def summary(self) -> str:
        ranks = list(self.ranks.values())
        if self.restored:
            return (f"EVA: ranks {min(ranks)} to {max(ranks)} (total {sum(ranks)}) as the "
                    "checkpoint holds them")
        left = sum(self.active.values())
        how = (f"converged after {self.batches} batches" if not left else
               f"{left} of {len(self.fits)} fits had not converged (tau {self.ev.tau}) "
               f"after {self.batches} batches; their components as they stood")
        return (f"EVA: {how}; ranks {min(ranks)} to {max(ranks)} over {len(ranks)} "
                f"matrices (total {sum(ranks)}, at most {max(self.k.values())})")

    # ---------------------------------------------------------------- the fits

    def _share(self, rows: dict[str, torch.Tensor]) -> None:
        """Layers whose first-batch inputs are equal share the first such layer's fit."""
        owners: list[str] = []
        for path, _ in self.layers:
            x = rows.get(path)
            same = next((o for o in owners if x is not None and rows[o].shape == x.shape
                         and torch.equal(rows[o], x)), None)
            if same is not None:
                self.owner[path] = same
                self.k[same] = max(self.k[same], self.k[path])
            else:
                self.owner[path] = path
                owners.append(path)
        for path in owners:
            self.k[path] = max(self.k[p] for p, o in self.owner.items() if o == path)
        for path in self.owner:
            self.k[path] = self.k[self.owner[path]]
        self.fits = {o: InputPCA(self.k[o]) for o in owners}
        self.active = {o: True for o in owners}
        self.ranks = dict(self.k)

    def _owner_rank(self, owner: str) -> int:
        return max(self.ranks[p] for p, o in self.owner.items() if o == owner)

    def _distribute(self) -> dict[str, int]:
        owners = list(self.fits)
        sharers = [p for p, o in self.owner.items() if o != p]
        order = owners + sharers  # owners first: a tie goes to the fit's owner
        ratios = [self.fits[self.owner[p]].ratio[:self.k[p]] for p in order]
        counts = distribute(ratios, self.budget)
        return {path: dict(zip(order, counts))[path] for path, _ in self.layers}


def build_eva(model: nn.Module, cfg: RunConfig, total_steps: int | None) -> MethodHandle:
    ev = cfg.eva
    layers = inject(model, cfg, ev.r, "eva.r",
                    lambda lin: EVALinear(lin, ev.r, ev.alpha, ev.dropout,
                                          ev.adjust_scaling_factors))
    budget = ev.budget if ev.budget is not None else ev.r * len(layers)
    handle = fixed_rank(model, cfg, layers)
    handle.calibration = EVAPass(layers, ev, budget)
    return handle
