"""The layers, the rank allocator and fp16 loss scaling on the GPU, in process.

Each layer and the allocator run once on the CPU and once on the GPU from the same
parameters, inputs and gradients; fp32 on both (PyTorch leaves TF32 off for matmuls by
default, and adalora never turns it on), so they agree to rounding. The fp16 tests use the
GPU's real autocast and GradScaler (a rehearsal on the CPU, fp32 with the same scaler)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from adalora_cli.engine.precision import decide
from adalora_cli.engine.step import Stepper
from adalora_cli.methods import apply_method
from adalora_cli.methods.adalora import SVDLinear, orthogonal_regularizer
from adalora_cli.methods.adapters import HoulsbyAdapter, PfeifferAdapter
from adalora_cli.methods.allocator import RankAllocator
from adalora_cli.methods.dora import DoRALinear
from adalora_cli.methods.lora import LoRALinear
from tests.methods._tiny import run_config, tiny_batch, tiny_bert

from .conftest import GPU, REHEARSAL


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Equal to fp32 rounding: a GPU adds a matmul's products in another order than the
    CPU, so an entry that is a difference of large terms may move by a few ulps of the
    largest entry; 2e-5 of the tensor's largest entry bounds that (a wrong formula is off
    by its own size)."""
    err = float((got - want).abs().max())
    assert err <= 2e-5 * float(want.abs().max()) + 1e-7, f"{what}: max |diff| {err:g}"

LAYERS = {
    "svd": lambda base: SVDLinear(base, r0=4, alpha=8.0),
    "lora": lambda base: LoRALinear(base, r=4, alpha=8.0),
    "rslora": lambda base: LoRALinear(base, r=4, alpha=8.0, rslora=True),
    "dora": lambda base: DoRALinear(base, r=4, alpha=8.0),
    "houlsby": lambda base: HoulsbyAdapter(base, dim=8),
    "pfeiffer": lambda base: PfeifferAdapter(base, dim=8),
}


def _scrambled(kind: str) -> nn.Module:
    """The layer around a 48 -> 40 linear, every adapter parameter random (a zero ``lam``,
    ``B`` or ``up`` would hide the update from the comparison)."""
    torch.manual_seed(0)
    layer = LAYERS[kind](nn.Linear(48, 40))
    with torch.no_grad():
        for p in layer.adapter_parameters():
            p.normal_(0.0, 0.3)
    return layer


def _run(layer: nn.Module, x: torch.Tensor, device: torch.device):
    layer = copy.deepcopy(layer).to(device)
    x = x.detach().to(device).requires_grad_()  # a fresh leaf on each side
    out = layer(x)
    (out.square().sum() + (orthogonal_regularizer([layer]) if hasattr(layer, "factors")
                           else 0)).backward()
    grads = {name: p.grad.cpu() for name, p in layer.named_parameters() if p.grad is not None}
    return out.detach().cpu(), x.grad.cpu(), grads


@pytest.mark.parametrize("kind", list(LAYERS))
def test_layer_forward_and_backward_on_the_gpu_equal_the_cpu(kind):
    layer = _scrambled(kind)
    x = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(1))
    out_c, dx_c, grads_c = _run(layer, x, torch.device("cpu"))
    out_g, dx_g, grads_g = _run(layer, x, GPU)
    assert_close(out_g, out_c, "output")
    assert_close(dx_g, dx_c, "d input")
    trained = {n for n, p in layer.named_parameters() if p.requires_grad}
    assert set(grads_g) == set(grads_c) == trained  # the base too: nothing frozen here
    for name in grads_c:
        assert_close(grads_g[name], grads_c[name], name)
    # and the adapter really moved the output: without it the outputs differ
    assert (out_c - layer.base(x).detach()).abs().max() > 1e-2


# ------------------------------------------------------------------ the rank allocator


def _matrices(kind: str) -> list[tuple[str, nn.Module]]:
    torch.manual_seed(2)
    make = (lambda lin: SVDLinear(lin, 6, 8.0)) if kind == "svd" else (
        lambda lin: LoRALinear(lin, 6, 8.0))
    shapes = [(32, 32), (32, 32), (37, 32), (32, 37), (20, 50), (50, 20)]
    layers = [(f"m{i}", make(nn.Linear(d_in, d_out))) for i, (d_in, d_out) in
              enumerate(shapes)]
    with torch.no_grad():
        for _, layer in layers:
            for p in layer.adapter_parameters():
                p.normal_(0.0, 0.5)
    return layers


def _allocate(layers, device: torch.device, steps: int):
    """Allocator steps 1..steps on ``device`` with seeded random gradients and a plain SGD
    update between them; what each step reports, and the final averages and scores."""
    layers = [(path, copy.deepcopy(layer).to(device)) for path, layer in layers]
    alloc = RankAllocator(layers, budget=12, total_steps=steps, t_init=3, t_final=4,
                          delta_t=2)
    g = torch.Generator().manual_seed(3)
    reports = []
    for t in range(1, steps + 1):
        for _, layer in layers:
            for p in layer.adapter_parameters():
                p.grad = torch.randn(p.shape, generator=g).to(device)
        with torch.no_grad():
            for _, layer in layers:
                for p in layer.adapter_parameters():
                    p -= 0.01 * p.grad
        report = alloc.step(t)
        reports.append((report.budget, report.ranks))
        for _, layer in layers:
            for p in layer.adapter_parameters():
                p.grad = None
    return reports, {name: getattr(alloc, name).cpu() for name in ("I", "I_bar", "U_bar")}, \
        alloc.scores().cpu(), alloc.mask.cpu()


@pytest.mark.parametrize("kind", ["svd", "lora"])  # AdaLoRA; prune-LoRA's doublets
def test_the_allocator_on_the_gpu_scores_masks_and_budgets_as_on_the_cpu(kind):
    layers = _matrices(kind)
    reports_c, avg_c, scores_c, mask_c = _allocate(layers, torch.device("cpu"), 20)
    reports_g, avg_g, scores_g, mask_g = _allocate(layers, GPU, 20)
    # the budget schedule step by step, and the rank pattern at every mask event
    assert reports_g == reports_c
    # the budgets by hand (b0 = 6 matrices x r0 6 = 36, b(T) 12, T 20, t_i 3, t_f 4: the
    # middle phase is floor(12 + 24 (1 - (t - 3) / 13)^3) for t = 4..16)
    by_hand = [36, 36, 36, 30, 26, 22, 19, 17, 15, 14, 13, 12, 12, 12, 12, 12,
               12, 12, 12, 12]
    assert [b for b, _ in reports_c] == by_hand
    events = [t for t, (_, ranks) in enumerate(reports_c, start=1) if ranks is not None]
    # every delta_t in the middle phase, then the frozen final pattern at T - t_f + 1
    assert events == [4, 6, 8, 10, 12, 14, 16, 17]
    assert sum(reports_c[16][1].values()) == 12  # the final pattern keeps b(T)
    for name in avg_c:
        assert torch.allclose(avg_g[name], avg_c[name], atol=1e-7, rtol=1e-5), name
    assert torch.allclose(scores_g, scores_c, atol=1e-9, rtol=1e-5)
    assert torch.equal(mask_g, mask_c) and int(mask_c.sum()) == 12


# ------------------------------------------------------------------ fp16 and the scaler


def _fp16_stepper(init_scale: float, steps: int = 40):
    """The smoke shape of AdaLoRA (tiny BERT, b0 48 -> b(T) 16) on the GPU under real fp16
    autocast and a GradScaler starting at ``init_scale``."""
    cfg = run_config("adalora", adalora={"budget": 16, "init_rank": 4, "alpha": 8.0,
                                         "t_init": 4, "delta_t": 2, "t_final": 8},
                     train={"precision": "fp16", "device": str(GPU),
                            "learning_rate": 5e-3, "warmup_steps": 2})
    model = tiny_bert().to(GPU)
    handle = apply_method(model, cfg, steps)
    stepper = Stepper.build(model, handle, cfg.train, steps, decide(cfg, GPU))
    stepper.scaler = torch.amp.GradScaler(GPU.type, init_scale=init_scale)
    # a rehearsal on the CPU runs fp32 with the loss scaler; the GPU, real fp16 autocast
    assert stepper.precision == ("fp32" if REHEARSAL else "fp16")
    return stepper


def _batch(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.to(GPU) for k, v in tiny_batch(seed).items()}


def test_fp16_importance_sees_unscaled_gradients():
    """Eq. 8's |w * grad| must not carry the loss scale: two runs whose scales differ by
    2^6 give the same averages (to fp16's rounding), not averages 64 times apart."""
    runs = []
    for scale in (2.0 ** 14, 2.0 ** 8):
        stepper = _fp16_stepper(scale)
        assert stepper.scaler.is_enabled()
        for t in (1, 2, 3):
            loss, _ = stepper.backward(_batch(t))
            assert not stepper.update(t, loss).skipped
        runs.append(stepper.handle.allocator.I_bar.clone())
    high, low = runs
    assert float(high.sum()) > 0
    assert float(high.sum()) == pytest.approx(float(low.sum()), rel=1e-2)
    close = torch.isclose(high, low, rtol=5e-2, atol=1e-6).float().mean()
    assert close > 0.99, f"only {close:.3f} of the entries agree"


def test_fp16_an_overflowing_step_is_skipped_and_leaves_the_averages_alone():
    stepper = _fp16_stepper(2.0 ** 10)
    alloc = stepper.handle.allocator
    for t in (1, 2):
        loss, _ = stepper.backward(_batch(t))
        assert not stepper.update(t, loss).skipped
    before = {n: getattr(alloc, n).clone() for n in ("I", "I_bar", "U_bar")}
    weights = [p.detach().clone() for p in stepper.handle.trainable]
    scale = stepper.scaler.get_scale()
    loss, _ = stepper.backward(_batch(3))
    stepper.handle.trainable[0].grad.view(-1)[0] = math.inf  # as an fp16 overflow leaves it
    log = stepper.update(3, loss)
    assert log.skipped and stepper.skipped == 1
    for name, value in before.items():
        assert torch.equal(getattr(alloc, name), value), name
    assert all(torch.equal(p, w) for p, w in zip(stepper.handle.trainable, weights))
    assert stepper.scaler.get_scale() == scale * 0.5
    loss, _ = stepper.backward(_batch(4))  # the next step is scored again
    assert not stepper.update(4, loss).skipped
    assert not torch.equal(alloc.I_bar, before["I_bar"])


# ------------------------------------------------------------------ the step as built on CUDA


def _adalora_steps(device: torch.device, steps: int = 8):
    """The smoke shape of AdaLoRA (tiny BERT, b0 48 -> b(T) 16, gamma 0.5) built on the CPU
    as the loop builds it, moved to ``device``, stepped ``steps`` times in fp32 through
    :meth:`Stepper.build`'s step: per-step losses and regularizers, and the final weights."""
    cfg = run_config("adalora", adalora={"budget": 16, "init_rank": 4, "alpha": 8.0,
                                         "gamma": 0.5, "t_init": 2, "delta_t": 2,
                                         "t_final": 2},
                     train={"precision": "fp32", "device": str(device),
                            "learning_rate": 5e-3, "warmup_steps": 0})
    model = tiny_bert()
    handle = apply_method(model, cfg, steps)  # on the CPU: the same draws on both sides
    model.to(device)
    stepper = Stepper.build(model, handle, cfg.train, steps, decide(cfg, device))
    losses, regs, first = [], [], None
    for t in range(1, steps + 1):
        loss, reg = stepper.backward({k: v.to(device) for k, v in tiny_batch(t).items()})
        if first is None:
            first = [p.grad.detach().cpu().clone() for p in handle.trainable]
        stepper.update(t, loss)
        losses.append(float(loss))
        regs.append(float(reg.detach()))
    return stepper, losses, regs, first, [p.detach().cpu() for p in handle.trainable]


def test_the_gpu_step_with_fused_adamw_and_the_closed_form_regularizer_equals_the_cpu():
    """On CUDA the step uses fused AdamW and adds Eq. 4's gradient in closed form (fewer
    kernel launches); on the CPU, torch's default AdamW and autograd. Same run to rounding:
    the first step's gradients (the regularizer's share in them), then the losses,
    regularizer values and rank pattern of every step, and the trained weights. (Adam moves
    an entry by about the learning rate whatever its gradient's size, so an entry whose
    gradient is rounding noise may end up a fraction of it apart: the weights get a looser
    bound than the gradients.)"""
    cpu = torch.device("cpu")
    s_c, loss_c, reg_c, g_c, w_c = _adalora_steps(cpu)
    s_g, loss_g, reg_g, g_g, w_g = _adalora_steps(GPU)
    assert not s_c.closed_form_reg and s_c.optimizer.defaults["fused"] is None
    assert s_g.closed_form_reg is (not REHEARSAL)
    assert s_g.optimizer.defaults["fused"] is (None if REHEARSAL else True)
    assert loss_g == pytest.approx(loss_c, rel=1e-5)
    assert reg_g == pytest.approx(reg_c, rel=1e-5)
    assert reg_c[0] > 0.1  # the regularizer is really in play
    for got, want in zip(g_g, g_c):
        assert_close(got, want, "first step's gradient")
    assert s_g.handle.allocator.rank_pattern() == s_c.handle.allocator.rank_pattern()
    for got, want in zip(w_g, w_c):
        assert float((got - want).abs().max()) < 1e-3  # learning rate 5e-3, 8 steps
