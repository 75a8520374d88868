"""rsLoRA, DoRA, PiSSA and LoRA+ layers and builders against plain reimplementations and
hand counts (PEFT itself is the reference in test_peft_fidelity.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from adalora_cli.config import ConfigError
from adalora_cli.methods import apply_method
from adalora_cli.methods.dora import DoRALinear
from adalora_cli.methods.lora import LoRALinear
from adalora_cli.methods.pissa import PiSSALinear
from tests.methods._tiny import FFN, HIDDEN, run_config, tiny_batch, tiny_bert

COSTS = [HIDDEN + HIDDEN] * 8 + [FFN + HIDDEN] * 4  # d_in + d_out of the 12 matrices


def _linear(seed: int = 0, d_in: int = 6, d_out: int = 4) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(d_in, d_out)
    nn.init.normal_(lin.weight)
    return lin


def test_rslora_scales_by_alpha_over_sqrt_r():
    layer = LoRALinear(_linear(), r=4, alpha=6.0, rslora=True)
    assert layer.scaling == 3.0  # 6 / sqrt(4)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), layer.base(x) + 3.0 * x @ (layer.B @ layer.A).T)


def test_dora_is_magnitude_times_direction():
    base = _linear(1)
    layer = DoRALinear(base, r=2, alpha=4.0)  # s = 2
    W0 = base.weight.detach()
    torch.testing.assert_close(layer.m, W0.norm(dim=1))  # ||W0|| per output feature
    x = torch.randn(5, 6)
    torch.testing.assert_close(layer(x), base(x))  # B = 0: W' = W0
    with torch.no_grad():
        layer.B.normal_()
        layer.m.mul_(torch.tensor([1.0, 2.0, 0.5, 1.5]))
    V = W0 + 2.0 * layer.B.detach() @ layer.A.detach()
    W = layer.m.detach().unsqueeze(1) * V / V.norm(dim=1, keepdim=True)
    torch.testing.assert_close(layer(x), x @ W.T + base.bias)
    torch.testing.assert_close(layer.delta_weight(), W - W0)


def test_dora_treats_the_norm_as_a_constant_in_the_backward_pass():
    base = _linear(2)
    layer = DoRALinear(base, r=2, alpha=4.0)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(5, 6)
    layer(x).sum().backward()
    # the same function with ||V|| computed outside autograd, by hand
    A = layer.A.detach().clone().requires_grad_()
    B = layer.B.detach().clone().requires_grad_()
    m = layer.m.detach().clone().requires_grad_()
    W0 = base.weight.detach()
    norm = (W0 + 2.0 * B.detach() @ A.detach()).norm(dim=1)
    (x @ ((m / norm).unsqueeze(1) * (W0 + 2.0 * B @ A)).T + base.bias).sum().backward()
    for ours, ref in ((layer.A, A), (layer.B, B), (layer.m, m)):
        torch.testing.assert_close(ours.grad, ref.grad)


def test_dora_on_conv1d_is_dora_on_the_same_linear():
    torch.manual_seed(3)
    conv = Conv1D(4, 6)  # W stored (d_in, d_out)
    nn.init.normal_(conv.weight)
    linear = nn.Linear(6, 4)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
        linear.bias.copy_(conv.bias)
    a, b = DoRALinear(conv, r=2, alpha=2.0), DoRALinear(linear, r=2, alpha=2.0)
    with torch.no_grad():
        a.B.normal_()
        b.A.copy_(a.A)
        b.B.copy_(a.B)
    torch.testing.assert_close(a.m, b.m)
    x = torch.randn(3, 6)
    torch.testing.assert_close(a(x), b(x))
    torch.testing.assert_close(a.to_base_layout(a.delta_weight()), b.delta_weight().T)


def test_pissa_starts_on_the_principal_part_and_keeps_w0():
    base = _linear(4, d_in=6, d_out=5)
    W0 = base.weight.detach().clone()
    layer = PiSSALinear(base, r=2, alpha=4.0)  # s = 2
    U, S, Vh = torch.linalg.svd(W0)
    principal = U[:, :2] @ torch.diag(S[:2]) @ Vh[:2]
    torch.testing.assert_close(2.0 * layer.B @ layer.A, principal, atol=1e-5, rtol=0)
    assert torch.equal(base.weight, W0)  # the base is never rewritten
    assert not layer.A0.requires_grad and torch.equal(layer.A0, layer.A)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), base(x), atol=1e-5, rtol=0)  # W_res + s B0 A0 = W0
    with torch.no_grad():
        layer.B.add_(1.0)
    W_res = W0 - principal
    by_hand = x @ (W_res + 2.0 * layer.B @ layer.A).T + base.bias
    torch.testing.assert_close(layer(x), by_hand, atol=1e-5, rtol=0)
    torch.testing.assert_close(layer.delta_weight(), 2.0 * (layer.B @ layer.A - layer.B0
                                                             @ layer.A0))


@pytest.mark.parametrize("method, per_matrix", [
    ("rslora", lambda c, d_out: 3 * c),
    ("loraplus", lambda c, d_out: 3 * c),
    ("pissa", lambda c, d_out: 3 * c),  # the frozen principal factors do not count
    ("dora", lambda c, d_out: 3 * c + d_out),  # plus one magnitude per output feature
])
def test_parameter_counts_by_hand(method, per_matrix):
    model = tiny_bert()
    handle = apply_method(model, run_config(method, **{method: {"r": 3}}), None)
    d_outs = [HIDDEN] * 8 + [FFN, HIDDEN] * 2
    assert handle.adapter_params == sum(per_matrix(c, d) for c, d in zip(COSTS, d_outs))
    assert handle.head_params == 2 * HIDDEN + 2
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in handle.trainable}
    assert len(handle.kept) == (24 if method == "pissa" else 0)


def test_loraplus_groups_by_hand():
    model = tiny_bert()
    handle = apply_method(model, run_config("loraplus", loraplus={"r": 2, "lr_ratio": 8}), None)
    groups = handle.optimizer_groups(1e-3, 0.05)
    a_ids = {id(layer.A) for _, layer in handle.layers}
    b_ids = {id(layer.B) for _, layer in handle.layers}
    assert {id(p) for p in groups[0]["params"]} == a_ids | {id(model.classifier.weight)}
    assert {id(p) for p in groups[1]["params"]} == b_ids
    assert [id(p) for p in groups[2]["params"]] == [id(model.classifier.bias)]
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [
        (1e-3, 0.05), (8e-3, 0.05), (8e-3, 0.0)]


def test_every_variant_starts_at_the_base_model():
    batch = tiny_batch()
    reference = tiny_bert().eval()(**batch).logits
    for method in ("rslora", "dora", "pissa", "loraplus"):
        model = tiny_bert()
        apply_method(model, run_config(method), None)
        got = model.eval()(**batch).logits
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("section, message", [
    ({"dora": {"r": 0}}, "dora.r must be >= 1, got 0"),
    ({"pissa": {"alpha": -1}}, "pissa.alpha must be > 0, got -1"),
    ({"rslora": {"dropout": 1.0}}, r"rslora.dropout must lie in \[0, 1\), got 1.0"),
    ({"loraplus": {"lr_ratio": 0.5}}, "loraplus.lr_ratio must be >= 1"),
])
def test_bad_sections_are_one_line_errors_on_construction(section, message):
    name = next(iter(section))
    with pytest.raises(ConfigError, match=message) as info:
        run_config(name, **section)
    assert "\n" not in str(info.value)


def test_a_rank_above_the_smallest_dimension_is_refused():
    with pytest.raises(ConfigError, match=r"pissa.r=40 exceeds the smallest adapted matrix "
                                          r"dimension \(32\)"):
        apply_method(tiny_bert(), run_config("pissa", pissa={"r": 40}), None)
