"""rsLoRA, DoRA, PiSSA and LoRA+ against PEFT 0.21 on identical weights: the forward, and one
optimizer step as the training loop takes it (``Stepper``: our parameter groups, AdamW, the
lr schedule) against PEFT's model with a plain AdamW (``create_loraplus_optimizer`` for
LoRA+).

The claim is the formula, so both models are compared in float64 (built in fp32 as a run
builds them, PEFT's PiSSA start included, which PEFT computes in fp32 only, then converted):
the logits (of order 1) agree to 1e-10 absolute before and after the step, and every trained
tensor after the step to 1e-10 absolute. Adam's first step moves an entry by about the
learning rate (1e-2) times ``g / (|g| + eps)``, so in fp32 an entry whose gradient is near
eps = 1e-8 turned the last-bit differences of two summation orders into a few 1e-5, as much
as a small slip in a formula; in float64 the largest difference seen was 7e-14 (LoRA+'s B at
16 times the rate), while a wrong scaling, group or learning rate moves a tensor by 1e-3 or
more. Where the claim is about fp32 itself (PEFT's PiSSA start from an fp32 SVD, DoRA's
starting magnitudes) the comparison stays in fp32. B and DoRA's magnitude are set away from
their zero / ||W0|| starts first, so that every path of the forward and every gradient is
exercised.
"""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from peft.optimizers import create_loraplus_optimizer

from adalora_cli.config import TrainConfig
from adalora_cli.engine.precision import Precision
from adalora_cli.engine.step import Stepper
from adalora_cli.methods import apply_method
from tests.methods._tiny import run_config, tiny_batch, tiny_bert

TARGETS = ["query", "key", "value", "attention.output.dense", "intermediate.dense",
           "output.dense"]
LR, WD = 1e-2, 0.01
LOGITS_ATOL, PARAM_ATOL = 1e-10, 1e-10


def _peft_twin(model, method: str, r: int, alpha: float, **extra):
    """PEFT's version of ``method`` on a copy of ``model`` (the head trains, as ours)."""
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=TARGETS,
                             modules_to_save=["classifier"], **extra)
    return peft.get_peft_model(copy.deepcopy(model.pristine), config)


def _lora_modules(peft_model):
    return {name.removeprefix("base_model.model."): m
            for name, m in peft_model.named_modules()
            if isinstance(m, peft.tuners.lora.LoraLayer)}


@torch.no_grad()
def _align(ours, handle, twin, *, magnitude: bool = False) -> None:
    """Give both the same non-trivial adapter and head weights (B and m away from init)."""
    g = torch.Generator().manual_seed(1)
    theirs = _lora_modules(twin)
    for path, layer in handle.layers:
        layer.B.copy_(torch.randn(layer.B.shape, generator=g) * 0.3)
        if magnitude:
            layer.m.mul_(1 + 0.2 * torch.rand(layer.m.shape, generator=g))
        t = theirs[path]
        t.lora_A["default"].weight.copy_(layer.A)
        t.lora_B["default"].weight.copy_(layer.B)
        if magnitude:
            t.lora_magnitude_vector["default"].weight.copy_(layer.m)
    head = twin.base_model.model.classifier.modules_to_save["default"]
    head.weight.copy_(ours.classifier.weight)
    head.bias.copy_(ours.classifier.bias)


def _in_float64(model, twin) -> None:
    """Both models in float64 from here on, parameters kept (the handle's stay valid): the
    claim is the formula, so the rounding of fp32 is kept out of the comparison."""
    model.double()
    twin.double()


def _ours(method: str, section: dict):
    """Our ``method`` on the tiny BERT, and a pristine copy of that BERT for PEFT."""
    model = tiny_bert(seed=3)
    model.train()
    pristine = copy.deepcopy(model)
    handle = apply_method(model, run_config(method, **{method: section}), None)
    model.pristine = pristine
    return model, handle


def _step_ours(model, handle, batch) -> None:
    # no autocast, as PEFT's twin steps (auto would autocast to bf16 on a CPU with native
    # bf16): the step runs in the parameters' own float64
    train = TrainConfig(learning_rate=LR, weight_decay=WD, max_grad_norm=0.0,
                        precision="fp32")
    stepper = Stepper.build(model, handle, train, steps=10,
                            precision=Precision.of(train.precision, torch.device("cpu")))
    stepper.backward(batch)
    stepper.update(1)


def _step_theirs(twin, batch, optimizer=None) -> None:
    params = [p for p in twin.parameters() if p.requires_grad]
    optimizer = optimizer or torch.optim.AdamW(params, lr=LR, weight_decay=WD)
    twin(**batch).loss.backward()
    optimizer.step()


def _compare(model, handle, twin, batch, *, magnitude: bool = False) -> None:
    model.eval(), twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, twin(**batch).logits,
                                   atol=LOGITS_ATOL, rtol=0)
    model.train(), twin.train()


def _compare_params(model, handle, twin, *, magnitude: bool = False) -> None:
    theirs = _lora_modules(twin)
    for path, layer in handle.layers:
        t = theirs[path]
        torch.testing.assert_close(layer.A, t.lora_A["default"].weight, atol=PARAM_ATOL, rtol=0)
        torch.testing.assert_close(layer.B, t.lora_B["default"].weight, atol=PARAM_ATOL, rtol=0)
        if magnitude:
            torch.testing.assert_close(layer.m, t.lora_magnitude_vector["default"].weight,
                                       atol=PARAM_ATOL, rtol=0)
    head = twin.base_model.model.classifier.modules_to_save["default"]
    torch.testing.assert_close(model.classifier.weight, head.weight, atol=PARAM_ATOL, rtol=0)
    torch.testing.assert_close(model.classifier.bias, head.bias, atol=PARAM_ATOL, rtol=0)


def _forward_and_one_step(model, handle, twin, *, magnitude=False, optimizer=None) -> None:
    batch = tiny_batch(seed=5)
    _compare(model, handle, twin, batch)
    before = model.classifier.weight.detach().clone()
    _step_ours(model, handle, batch)
    _step_theirs(twin, batch, optimizer)
    assert (model.classifier.weight - before).abs().max() > LR / 10  # it moved, by about lr
    _compare_params(model, handle, twin, magnitude=magnitude)
    _compare(model, handle, twin, batch)


def test_rslora_equals_peft_use_rslora():
    model, handle = _ours("rslora", {"r": 4, "alpha": 8})
    assert handle.layers[0][1].scaling == 8 / 2  # alpha / sqrt(r)
    twin = _peft_twin(model, "rslora", 4, 8, use_rslora=True)
    _in_float64(model, twin)
    _align(model, handle, twin)
    _forward_and_one_step(model, handle, twin)


@pytest.mark.parametrize("rslora", [False, True])
def test_dora_equals_peft_use_dora(rslora):
    model, handle = _ours("dora", {"r": 4, "alpha": 8, "rslora": rslora})
    twin = _peft_twin(model, "dora", 4, 8, use_dora=True, use_rslora=rslora)
    # the magnitudes start as ||W0|| per output feature in both
    for path, layer in handle.layers:
        peft_m = _lora_modules(twin)[path].lora_magnitude_vector["default"].weight
        torch.testing.assert_close(layer.m, peft_m, atol=1e-6, rtol=0)
    _in_float64(model, twin)
    _align(model, handle, twin, magnitude=True)
    _forward_and_one_step(model, handle, twin, magnitude=True)


def test_pissa_init_and_step_equal_peft_init_lora_weights_pissa():
    model, handle = _ours("pissa", {"r": 4})  # alpha unset: alpha = r, s = 1
    twin = _peft_twin(model, "pissa", 4, 4, init_lora_weights="pissa")
    theirs = _lora_modules(twin)
    for path, layer in handle.layers:
        t = theirs[path]
        # the same principal factors (same exact SVD), and PEFT's rewritten base is our
        # W0 - s B0 A0 while ours keeps W0
        torch.testing.assert_close(layer.A, t.lora_A["default"].weight, atol=1e-6, rtol=0)
        torch.testing.assert_close(layer.B, t.lora_B["default"].weight, atol=1e-6, rtol=0)
        w_res = layer.base.weight - layer.scaling * layer.B0 @ layer.A0
        torch.testing.assert_close(w_res, t.base_layer.weight, atol=1e-6, rtol=0)
    _in_float64(model, twin)
    with torch.no_grad():  # step 0: the PiSSA model computes the base model
        batch = tiny_batch(seed=5)
        model.eval()
        base = tiny_bert(seed=3).double().eval()
        torch.testing.assert_close(model(**batch).logits, base(**batch).logits,
                                   atol=LOGITS_ATOL, rtol=0)
        model.train()
    with torch.no_grad():  # PEFT's rewritten base, from our factors in float64
        for path, layer in handle.layers:
            theirs[path].base_layer.weight.copy_(
                layer.base.weight - layer.scaling * layer.B0 @ layer.A0)
    _align(model, handle, twin)
    _forward_and_one_step(model, handle, twin)


def test_pissa_scaling_other_than_one_still_starts_at_w0():
    model, handle = _ours("pissa", {"r": 3, "alpha": 12})  # s = 4
    twin = _peft_twin(model, "pissa", 3, 12, init_lora_weights="pissa")
    for path, layer in handle.layers:
        t = _lora_modules(twin)[path]
        torch.testing.assert_close(layer.B, t.lora_B["default"].weight, atol=1e-6, rtol=0)
        torch.testing.assert_close(layer.delta_weight(), torch.zeros_like(layer.delta_weight()))


def test_loraplus_equals_peft_create_loraplus_optimizer():
    model, handle = _ours("loraplus", {"r": 4, "alpha": 8, "lr_ratio": 16})
    twin = _peft_twin(model, "loraplus", 4, 8)
    _in_float64(model, twin)
    _align(model, handle, twin)
    optimizer = create_loraplus_optimizer(twin, torch.optim.AdamW, lr=LR, loraplus_lr_ratio=16,
                                          loraplus_weight_decay=WD)
    # B steps at 16 x LR: a wrong ratio, even 15 for 16, puts B 0.01 apart
    _forward_and_one_step(model, handle, twin, optimizer=optimizer)


def test_loraplus_differs_from_lora_by_the_ratio_alone():
    """The same weights and step under LoRA (one rate) and LoRA+ (B 16x faster): A and the
    head's matrix move alike, B and the head's bias 16 times as far (Adam's first step moves
    an entry by about lr whatever its gradient)."""
    runs = {}
    for method in ("lora", "loraplus"):
        model, handle = _ours(method, {"r": 4, "alpha": 8})  # the same A draws
        with torch.no_grad():
            for _, layer in handle.layers:
                layer.B.fill_(0.1)
        _step_ours(model, handle, tiny_batch(seed=5))
        runs[method] = (model, handle.layers[0][1])
    (lora_model, lora), (plus_model, plus) = runs["lora"], runs["loraplus"]
    torch.testing.assert_close(plus.A, lora.A, atol=1e-7, rtol=0)
    torch.testing.assert_close(plus_model.classifier.weight, lora_model.classifier.weight,
                               atol=1e-7, rtol=0)
    ratio = (plus.B - 0.1).abs().sum() / (lora.B - 0.1).abs().sum()
    assert 15.5 < ratio < 16.5
    bias0 = tiny_bert(seed=3).classifier.bias
    ratio = ((plus_model.classifier.bias - bias0).abs().sum()
             / (lora_model.classifier.bias - bias0).abs().sum())
    assert 15.5 < ratio < 16.5
