"""RankAllocator: importance EMAs, triplet scores, masking and resume (Eqs. (5)-(11);
docs/maths.md#importance-score, docs/maths.md#triplet-score, docs/maths.md#masking).

Gradients are set by hand and the "optimizer step" is a plain update, so every expected
value comes from a hand calculation or from the naive per-entry reference below.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.methods.allocator import RankAllocator, StepReport
from adalora_cli.methods.lora import LoRALinear

# ------------------------------------------------------------------ helpers


def _layers(kind: str = "svd", seed: int = 0) -> list[tuple[str, nn.Module]]:
    """Two matrices: a (d_out 3, d_in 5, r 2) and b (d_out 4, d_in 2, r 3)."""
    torch.manual_seed(seed)
    make = (lambda lin, r: SVDLinear(lin, r, 1.0)) if kind == "svd" else (
        lambda lin, r: LoRALinear(lin, r, 1.0))
    return [("a", make(nn.Linear(5, 3), 2)), ("b", make(nn.Linear(2, 4), 3))]


def _alloc(layers, **kw) -> RankAllocator:
    args = {"budget": 2, "total_steps": 1000, "t_init": 500, "t_final": 100, "delta_t": 1}
    args.update(kw)
    return RankAllocator(layers, **args)


def _factors(layer: nn.Module) -> dict[str, nn.Parameter]:
    if isinstance(layer, SVDLinear):
        return {"P": layer.P, "lam": layer.lam, "Q": layer.Q}
    return {"B": layer.B, "A": layer.A}


def _random_grads(layers, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _, layer in layers:
        for p in layer.adapter_parameters():
            p.grad = torch.randn(p.shape, generator=g)


def _plain_update(layers, lr: float = 0.1) -> None:
    with torch.no_grad():
        for _, layer in layers:
            for p in layer.adapter_parameters():
                p -= lr * (p.grad if p.grad is not None else 0)


def _set(param: torch.Tensor, values) -> None:
    with torch.no_grad():
        param.copy_(torch.as_tensor(values, dtype=param.dtype))


class NaiveScores:
    """Eqs. 7-11 entry by entry with Python floats: the independent reference."""

    def __init__(self, beta1: float, beta2: float):
        self.beta1, self.beta2 = beta1, beta2
        self.I, self.I_bar, self.U_bar = {}, {}, {}

    def update(self, layers) -> None:
        for path, layer in layers:
            for name, p in _factors(layer).items():
                key = (path, name)
                w = p.detach().flatten().tolist()
                g = p.grad.flatten().tolist() if p.grad is not None else [0.0] * len(w)
                I = [abs(a * b) for a, b in zip(w, g)]
                ib = self.I_bar.get(key, [0.0] * len(w))
                ub = self.U_bar.get(key, [0.0] * len(w))
                ib = [self.beta1 * x + (1 - self.beta1) * i for x, i in zip(ib, I)]
                ub = [self.beta2 * u + (1 - self.beta2) * abs(i - x) for u, i, x in zip(ub, I, ib)]
                self.I[key], self.I_bar[key], self.U_bar[key] = I, ib, ub

    def s(self, key, variant: str) -> list[float]:
        if variant == "sensitivity":
            return self.I[key]
        return [x * u for x, u in zip(self.I_bar[key], self.U_bar[key])]

    def triplet_scores(self, layers, variant: str) -> list[float]:
        out = []
        for path, layer in layers:
            left, lam, right = layer.triplet_factors()
            (d_out, r), d_in = left.shape, right.shape[1]
            names = ("P", "lam", "Q") if lam is not None else ("B", None, "A")
            s_left, s_right = self.s((path, names[0]), variant), self.s((path, names[2]), variant)
            for i in range(r):
                score = sum(s_left[j * r + i] for j in range(d_out)) / d_out
                score += sum(s_right[i * d_in + j] for j in range(d_in)) / d_in
                if lam is not None:
                    score += self.s((path, "lam"), variant)[i]
                out.append(score)
        return out


# ------------------------------------------------------------------ scores


def test_ema_by_hand_single_entry() -> None:
    layers = _layers()
    alloc = _alloc(layers)
    _, a = layers[0]
    _set(a.lam, [2.0, 0.0])
    for p in a.adapter_parameters():
        p.grad = torch.zeros_like(p)
    for p in layers[1][1].adapter_parameters():
        p.grad = torch.zeros_like(p)
    a.lam.grad[0] = 0.5  # I = |2 * 0.5| = 1 on this one entry, 0 everywhere else
    alloc.step(1)
    # I_bar = 0.15 * 1 = 0.15; U_bar = 0.15 * |1 - 0.15| = 0.1275; S = 0.15 * 0.1275
    expected = torch.zeros(5)
    expected[0] = 0.019125
    torch.testing.assert_close(alloc.scores(), expected)
    a.lam.grad.zero_()
    alloc.step(2)
    # I_bar = 0.85 * 0.15 = 0.1275; U_bar = 0.85 * 0.1275 + 0.15 * |0 - 0.1275| = 0.1275
    expected[0] = 0.1275 * 0.1275
    torch.testing.assert_close(alloc.scores(), expected)


@pytest.mark.parametrize("variant", ["smoothed", "sensitivity"])
@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_scores_match_naive_reference_over_three_steps(variant: str, kind: str) -> None:
    layers = _layers(kind)
    alloc = _alloc(layers, beta1=0.7, beta2=0.9, score=variant)
    ref = NaiveScores(0.7, 0.9)
    for t in (1, 2, 3):
        _random_grads(layers, seed=t)
        _plain_update(layers)  # the allocator sees the updated weights, as after optimizer.step
        alloc.step(t)
        ref.update(layers)
        expected = torch.tensor(ref.triplet_scores(layers, variant))
        torch.testing.assert_close(alloc.scores(), expected, rtol=1e-5, atol=1e-9)
    # The flat EMA buffer holds, in order, every entry of P, lam, Q of each layer.
    flat = [x for path, layer in layers for name in _factors(layer)
            for x in ref.I_bar[(path, name)]]
    torch.testing.assert_close(alloc.I_bar, torch.tensor(flat), rtol=1e-5, atol=1e-9)


def test_magnitude_scores() -> None:
    layers = _layers("svd")
    _set(layers[0][1].lam, [-3.0, 0.5])
    _set(layers[1][1].lam, [0.0, 2.0, -1.0])
    alloc = _alloc(layers, score="magnitude")
    torch.testing.assert_close(alloc.scores(), torch.tensor([3.0, 0.5, 0.0, 2.0, 1.0]))
    lora = _layers("lora")
    B, A = lora[0][1].B, lora[0][1].A  # (3, 2), (2, 5)
    _set(B, [[3.0, 0.0], [4.0, 1.0], [0.0, 0.0]])  # column norms 5, 1
    _set(A, [[1.0, 0, 0, 0, 0], [2.0, 0, 0, 0, 0]])  # row norms 1, 2
    scores = _alloc(lora, score="magnitude").scores()
    torch.testing.assert_close(scores[:2], torch.tensor([5.0, 2.0]))  # ||B[:, i]|| ||A[i, :]||


def test_unused_parameter_without_grad_counts_as_zero() -> None:
    layers = _layers()
    alloc = _alloc(layers)
    ref = NaiveScores(0.85, 0.85)
    _random_grads(layers, seed=4)
    layers[1][1].Q.grad = None  # e.g. a module skipped in forward
    layers[1][1].lam.grad = None
    alloc.step(1)
    ref.update(layers)
    expected = torch.tensor(ref.triplet_scores(layers, "smoothed"))
    torch.testing.assert_close(alloc.scores(), expected, rtol=1e-5, atol=1e-9)


# ------------------------------------------------------------------ masking


def _mask_run(scores_a, scores_b, budget: int) -> tuple[list[float], list[float]]:
    """Mask once at budget ``budget`` with magnitude scores |lam| and return both lam."""
    layers = _layers()
    _set(layers[0][1].lam, scores_a)
    _set(layers[1][1].lam, scores_b)
    # T = 3, t_f = 2: step 2 is the first of the final phase, which masks at bT.
    alloc = _alloc(layers, budget=budget, total_steps=3, t_init=0, t_final=2, score="magnitude")
    _random_grads(layers, seed=0)
    out = alloc.step(2)
    assert sum(out.ranks.values()) == budget
    return layers[0][1].lam.tolist(), layers[1][1].lam.tolist()


def test_masking_keeps_exactly_b_with_ties_broken_by_index() -> None:
    # Scores [5, 3 | 3, 1, 3]: keeping 3 of them takes the two earliest 3's.
    assert _mask_run([5.0, 3.0], [3.0, 1.0, 3.0], 3) == ([5.0, 3.0], [3.0, 0.0, 0.0])
    assert _mask_run([5.0, 3.0], [3.0, 1.0, 3.0], 4) == ([5.0, 3.0], [3.0, 0.0, 3.0])
    # All scores equal: still exactly b, the lowest global indices win.
    assert _mask_run([1.0, 1.0], [1.0, 1.0, 1.0], 3) == ([1.0, 1.0], [1.0, 0.0, 0.0])
    assert _mask_run([1.0, 1.0], [1.0, 1.0, 1.0], 1) == ([1.0, 0.0], [0.0, 0.0, 0.0])


def test_all_zero_scores_keep_exactly_the_scheduled_budget() -> None:
    layers = _layers()
    for _, layer in layers:
        _set(layer.lam, torch.ones_like(layer.lam))
    # b0 = 5, bT = 2, span 4: b(1) = floor(2 + 3 * 27/64) = 3, b(2) = floor(2 + 3/8) = 2
    alloc = _alloc(layers, budget=2, total_steps=6, t_init=0, t_final=2, delta_t=1)
    for t, b_t in zip((1, 2, 3), (3, 2, 2)):
        for _, layer in layers:
            for p in layer.adapter_parameters():
                p.grad = torch.zeros_like(p)  # every score is 0: all ties
        out = alloc.step(t)
        assert out.budget == b_t and sum(out.ranks.values()) == b_t
        kept = [x for _, layer in layers for x in layer.lam.tolist()]
        assert kept == [1.0] * b_t + [0.0] * (5 - b_t)


def test_masked_lam_regrows_between_events_and_p_q_keep_training() -> None:
    layers = _layers()
    _, a = layers[0]
    _set(a.lam, [1.0, 2.0])
    _set(layers[1][1].lam, [3.0, 4.0, 5.0])
    alloc = _alloc(layers, budget=1, total_steps=20, t_init=0, t_final=5, delta_t=2,
                   score="magnitude")
    _random_grads(layers, seed=0)
    assert alloc.step(1).ranks is None  # 1 % 2 != 0: no mask event
    assert a.lam.tolist() == [1.0, 2.0]
    P_before, Q_before = a.P.detach().clone(), a.Q.detach().clone()
    out = alloc.step(2)  # b(2) = floor(1 + 4 * (13/15)**3) = 3: keeps |lam| 5, 4, 3
    assert out.ranks == {"a": 0, "b": 3} and a.lam.tolist() == [0.0, 0.0]
    assert torch.equal(a.P, P_before) and torch.equal(a.Q, Q_before)  # only lam is masked
    _set(a.lam, [7.0, 0.5])  # the optimizer moved the masked lam
    assert alloc.step(3).ranks is None
    assert a.lam.tolist() == [7.0, 0.5]  # not re-masked between events
    out = alloc.step(4)  # b(4) = floor(1 + 4 * (11/15)**3) = 2: keeps |lam| 7 and 5
    assert out.ranks == {"a": 1, "b": 1} and a.lam.tolist() == [7.0, 0.0]


def test_final_phase_freezes_pattern_and_reapplies_it() -> None:
    layers = _layers()
    _, a = layers[0]
    _, b = layers[1]
    _set(a.lam, [1.0, 2.0])
    _set(b.lam, [3.0, 0.5, 0.25])
    alloc = _alloc(layers, budget=2, total_steps=10, t_init=0, t_final=3, delta_t=100,
                   score="magnitude")
    _random_grads(layers, seed=0)
    for t in range(1, 8):  # t = 7 = T - t_f: last step before the final phase, no event
        assert alloc.step(t).ranks is None
    I_bar = alloc.I_bar.clone()
    out = alloc.step(8)  # first final step: pattern at bT = 2 from |lam| -> {3, 2}
    assert out == StepReport(2, {"a": 1, "b": 1})
    assert a.lam.tolist() == [0.0, 2.0] and b.lam.tolist() == [3.0, 0.0, 0.0]
    _set(a.lam, [9.0, 2.0])  # a pruned lam regrows and would now win on magnitude
    _set(b.lam, [0.5, 8.0, 0.0])
    assert alloc.step(9) == StepReport(2)  # no new pattern...
    assert a.lam.tolist() == [0.0, 2.0] and b.lam.tolist() == [0.5, 0.0, 0.0]  # ...re-applied
    assert alloc.rank_pattern() == {"a": 1, "b": 1}
    assert torch.equal(alloc.I_bar, I_bar)  # no score updates in the final phase
    # kept: one triplet of a (5 + 3 + 1) and one of b (2 + 4 + 1)
    assert alloc.final_adapter_params() == 9 + 7


def test_ema_updates_during_warm_up_without_masking() -> None:
    layers = _layers()
    alloc = _alloc(layers, budget=1, total_steps=20, t_init=5, t_final=5, delta_t=1)
    _random_grads(layers, seed=1)
    _set(layers[0][1].lam, [1.0, 1.0])
    out = alloc.step(1)
    assert out == StepReport(5) and torch.count_nonzero(alloc.I_bar) > 0
    assert layers[0][1].lam.tolist() == [1.0, 1.0]


def test_prune_lora_zeroes_whole_doublets() -> None:
    layers = _layers("lora")
    _, a = layers[0]
    _set(a.B, torch.ones(3, 2))
    alloc = _alloc(layers, budget=1, total_steps=3, t_init=0, t_final=2, score="magnitude")
    _set(a.A, [[1.0, 0, 0, 0, 0], [2.0, 0, 0, 0, 0]])  # doublet 1 of a is the largest
    _set(layers[1][1].B, torch.zeros(4, 3))
    _random_grads(layers, seed=0)
    assert alloc.step(2).ranks == {"a": 1, "b": 0}
    assert a.B[:, 0].abs().sum() == 0 and a.A[0].abs().sum() == 0
    assert torch.equal(a.B[:, 1], torch.ones(3)) and a.A[1, 0] == 2.0
    assert alloc.final_adapter_params() == 5 + 3  # d_in + d_out, no singular value


# ------------------------------------------------------------------ resume


def _run(layers, alloc, steps) -> list[list[float]]:
    masks = []
    for t in steps:
        _random_grads(layers, seed=100 + t)
        _plain_update(layers)
        alloc.step(t)
        masks.append(alloc.mask.tolist())
    return masks


@pytest.mark.parametrize("split", [6, 13])  # mid-schedule, and inside the final phase
def test_state_dict_round_trip_reproduces_masks(split: int) -> None:
    kw = {"budget": 2, "total_steps": 16, "t_init": 2, "t_final": 4, "delta_t": 2}
    layers = _layers()
    alloc = _alloc(layers, **kw)
    _run(layers, alloc, range(1, split + 1))
    saved_weights = [{k: v.clone() for k, v in m.state_dict().items()} for _, m in layers]
    saved_state = alloc.state_dict()
    expected = _run(layers, alloc, range(split + 1, 17))

    fresh = _layers(seed=99)  # different initial weights, restored from the snapshot
    for (_, module), weights in zip(fresh, saved_weights):
        module.load_state_dict(weights)
    restored = _alloc(fresh, **kw)
    restored.load_state_dict(saved_state)
    assert restored.frozen == (split > 12)
    assert _run(fresh, restored, range(split + 1, 17)) == expected
    with pytest.raises(ValueError, match="different adapted matrices"):
        _alloc(_layers()[:1], **kw).load_state_dict(saved_state)


def test_follows_the_model_to_another_device() -> None:
    # A move to "meta" replaces the Parameter objects and changes the device, the two things
    # model.to("cuda") after building the allocator may do; no values exist there to check.
    layers = _layers()
    alloc = _alloc(layers)
    for _, layer in layers:
        layer.to("meta")
        for p in layer.adapter_parameters():
            p.grad = torch.zeros_like(p)
    assert alloc.step(1) == StepReport(5)
    assert alloc.I_bar.device.type == "meta" and alloc.mask.device.type == "meta"
    assert alloc.params[1] is layers[0][1].lam


def test_non_finite_gradients_carry_no_sensitivity() -> None:
    layers = _layers()
    alloc = _alloc(layers)
    ref = NaiveScores(0.85, 0.85)
    _random_grads(layers, seed=5)
    ref.update(layers)  # the reference sees the finite gradient of P ...
    layers[0][1].P.grad[0, 0] = float("inf")  # ... the allocator an fp16 overflow there
    layers[0][1].P.grad[1, 1] = float("nan")
    for flat in (0, 3):  # P[0, 0] and P[1, 1] in row-major order: their I counts as 0
        ref.I_bar[("a", "P")][flat] = ref.U_bar[("a", "P")][flat] = 0.0
    alloc.step(1)
    assert torch.isfinite(alloc.I_bar).all() and torch.isfinite(alloc.U_bar).all()
    expected = torch.tensor(ref.triplet_scores(layers, "smoothed"))
    torch.testing.assert_close(alloc.scores(), expected, rtol=1e-5, atol=1e-9)
