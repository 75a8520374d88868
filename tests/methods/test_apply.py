"""apply_method on a tiny BERT: what trains, how much, and what the handle carries.

Counts come from hand formulas over the tiny sizes (hidden h = 32, FFN 37, 2 layers,
2 labels); the head is the classifier (the BERT pooler belongs to the backbone).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method, parameter_table
from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.methods.adapters import HoulsbyAdapter, PfeifferAdapter
from adalora_cli.methods.allocator import budget_schedule
from adalora_cli.methods.lora import LoRALinear
from adalora_cli.methods.registry import METHODS
from tests.methods._tiny import FFN, HIDDEN, LABELS, LAYERS, run_config, tiny_batch, tiny_bert

H, F = HIDDEN, FFN
HEAD = H * LABELS + LABELS  # classifier weight + bias
# (d_in, d_out) of the six matrices of one layer: q, k, v, attention output, FFN in, FFN out
MATRICES = [(H, H)] * 4 + [(H, F), (F, H)]

CASES = {
    # method: (config sections, expected adapter params, adapter module type or None)
    "adalora": ({"adalora": {"init_rank": 4}},
                LAYERS * sum(4 * (i + o + 1) for i, o in MATRICES), SVDLinear),
    "lora": ({"lora": {"r": 4}}, LAYERS * sum(4 * (i + o) for i, o in MATRICES), LoRALinear),
    "houlsby": ({"adapter": {"dim": 8}}, LAYERS * 2 * (2 * H * 8 + 8 + H), HoulsbyAdapter),
    "pfeiffer": ({"adapter": {"dim": 8}}, LAYERS * (2 * H * 8 + 8 + H), PfeifferAdapter),
    # embeddings LayerNorm; per layer q k v o (4h), 2 LayerNorms (2h), FFN in (F) and out (h);
    # pooler dense
    "bitfit": ({}, H + LAYERS * (4 * H + 2 * H + F + H) + H, None),
}


def _expected_trainable(model: nn.Module, method: str, kind: type | None) -> set[int]:
    head = {id(p) for p in model.classifier.parameters()}
    if method == "full":
        return {id(p) for p in model.parameters()}
    if method == "bitfit":
        return head | {id(m.bias) for m in model.modules()
                       if isinstance(m, (nn.Linear, nn.LayerNorm)) and m.bias is not None}
    return head | {id(p) for m in model.modules() if isinstance(m, kind)
                   for p in m.adapter_parameters()}


@pytest.mark.parametrize("method", [*CASES, "full"])
def test_counts_and_trainable_set(method: str) -> None:
    model = tiny_bert()
    total = sum(p.numel() for p in model.parameters())
    sections, n_adapter, kind = CASES.get(method, ({}, total - HEAD, None))
    handle = apply_method(model, run_config(method, **sections), None)
    assert handle.adapter_params == n_adapter and handle.head_params == HEAD
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == _expected_trainable(model, method, kind)
    assert {id(p) for p in handle.trainable} == trainable
    assert handle.n_matrices == (6 * LAYERS if method in ("adalora", "lora") else 0)


@pytest.mark.parametrize("method", [*CASES, "full"])
def test_one_step_moves_only_trainable_params(method: str) -> None:
    model = tiny_bert()
    sections = CASES.get(method, ({},))[0]
    handle = apply_method(model, run_config(method, **sections), None)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    # Every parameter goes to the optimizer: frozen ones must stay put because they get no
    # gradient. Adam, because the second-step gradients behind a zero init are ~1e-13.
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(2):
        # Step 1 leaves the factor behind a zero init still (B = 0 zeroes A's gradient,
        # lam = 0 zeroes P's and Q's, up = 0 zeroes down's); step 2 moves it too.
        loss = model(**tiny_batch(step)).loss
        if handle.regularizer is not None:
            loss = loss + handle.reg_weight * handle.regularizer()
        loss.backward()
        opt.step()
        opt.zero_grad()
    for name, p in model.named_parameters():
        moved = not torch.equal(p, before[name])
        assert moved == p.requires_grad, name


def test_zero_init_factors_get_no_first_step_gradient() -> None:
    model = tiny_bert()
    handle = apply_method(model, run_config("adalora", adalora={"gamma": 0.0}), None)
    assert handle.regularizer is None
    model(**tiny_batch()).loss.backward()
    layer = handle.layers[0][1]
    assert torch.count_nonzero(layer.lam.grad) > 0  # d loss / d lam_i = s (P_i . g)(Q_i . x)
    assert torch.count_nonzero(layer.P.grad) == 0 and torch.count_nonzero(layer.Q.grad) == 0


@pytest.mark.parametrize("method", ["adalora", "lora", "houlsby", "pfeiffer"])
def test_output_unchanged_at_init(method: str) -> None:
    model = tiny_bert().eval()
    reference = copy.deepcopy(model)
    apply_method(model, run_config(method), None)
    batch = tiny_batch()
    del batch["labels"]
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference(**batch).logits)


def test_parameter_table_rows() -> None:
    model = tiny_bert()
    apply_method(model, run_config("lora", lora={"r": 4}), None)
    rows = parameter_table(model)
    assert len(rows) == 6 * LAYERS
    assert rows[0] == {"module": "bert.encoder.layer.0.attention.self.query", "kind": "LoRALinear",
                       "adapter_params": 4 * (H + H), "trainable": 4 * (H + H)}
    assert rows[4]["adapter_params"] == 4 * (H + F)  # intermediate.dense: d_in h, d_out F


def test_handle_hooks() -> None:
    handle = apply_method(tiny_bert(), run_config("lora"), 100)
    assert handle.regularizer is None and handle.after_step is None and handle.reg_weight == 0
    handle = apply_method(tiny_bert(), run_config("lora", lora={"gamma": 0.5}), 100)
    assert handle.reg_weight == 0.5 and handle.regularizer() > 0  # LoRA_regu on (B, A)
    svd_lora = run_config("adalora", adalora={"prune": False})
    assert apply_method(tiny_bert(), svd_lora, 100).after_step is None  # SVD-LoRA
    handle = apply_method(tiny_bert(), run_config("adalora", adalora={"budget": 24, "t_final": 5}),
                          100)
    assert handle.reg_weight == 0.1 and handle.after_step is not None
    assert handle.allocator.b0 == 6 * LAYERS * 4
    prune_lora = run_config("lora", lora={"prune": True, "r": 2},
                            adalora={"budget": 10, "t_final": 5})
    assert apply_method(tiny_bert(), prune_lora, 100).allocator.b0 == 24


def test_schedule_is_checked_when_pruning() -> None:
    cfg = run_config("adalora", adalora={"budget": 24, "t_init": 60, "t_final": 40})
    with pytest.raises(ConfigError, match=r"t_init=60.*t_final=40.*T=100"):
        apply_method(tiny_bert(), cfg, 100)
    apply_method(tiny_bert(), cfg, None)  # dry run: no schedule, no check
    with pytest.raises(ConfigError, match=r"budget=144.*b0=48"):
        apply_method(tiny_bert(), run_config("adalora"), 100)  # default budget 144 > 12 x 4


def test_full_schedule_on_tiny_bert_ends_at_the_budget() -> None:
    T, t_init, t_final, delta_t, bT = 30, 5, 10, 3, 10
    cfg = run_config("adalora", adalora={"budget": bT, "t_init": t_init, "t_final": t_final,
                                         "delta_t": delta_t})
    model = tiny_bert()
    handle = apply_method(model, cfg, T)
    opt = torch.optim.AdamW(handle.trainable, lr=1e-2)
    b0 = 6 * LAYERS * 4
    for t in range(1, T + 1):
        loss = model(**tiny_batch(t)).loss + handle.reg_weight * handle.regularizer()
        loss.backward()
        opt.step()
        logged = handle.after_step(t)
        opt.zero_grad()
        assert logged.budget == budget_schedule(t, b0, bT, t_init, t_final, T)
        event = (t_init < t <= T - t_final and t % delta_t == 0) or t == T - t_final + 1
        assert (logged.ranks is not None) == event
        if event:
            assert sum(logged.ranks.values()) == logged.budget
    ranks = handle.allocator.rank_pattern()
    layers = dict(handle.layers)
    assert sum(ranks.values()) == bT
    for path, layer in layers.items():  # masked singular values are exactly 0 at the end
        assert torch.count_nonzero(layer.lam) <= ranks[path]
    expected = sum(r * (layers[p].in_features + layers[p].out_features + 1)
                   for p, r in ranks.items())
    assert handle.allocator.final_adapter_params() == expected


@pytest.mark.parametrize("method", list(METHODS))
def test_trainable_params_are_adapter_plus_head_as_a_dry_run_counts_them(method: str) -> None:
    """The closing line's ``trained N parameters (A adapter + H head)`` adds up for every
    method, and a real build (T known: IncreLoRA holds room for the ranks it may grow)
    counts what a dry run (T unknown: no room) counts entry by entry."""
    sections = {"adalora": {"budget": 16, "t_init": 4, "delta_t": 2, "t_final": 8},
                "increlora": {"budget": 24}}  # 12 -> 24 ranks: several growth events
    dry = tiny_bert()
    apply_method(dry, run_config(method, **sections), None)
    trains = sum(p.numel() for p in dry.parameters() if p.requires_grad)
    handle = apply_method(tiny_bert(), run_config(method, **sections), 32)
    assert handle.trainable_params == handle.adapter_params + handle.head_params == trains
