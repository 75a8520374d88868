"""benchmarks/step_profile.py's variants of Eq. 3: what they claim to leave unchanged, they
do. The lam-cast variant is a no-op in fp32 (the cast returns lam itself), so its output and
gradients equal SVDLinear's bit for bit; with alpha / r0 folded into lam's copy it is only
close. Under bf16 autocast it computes Eq. 3 to bf16's rounding."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
from torch import nn

from adalora_cli.methods.adalora import SVDLinear
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import step_profile  # benchmarks/ is no package: its scripts import one another by name
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    base = nn.Linear(16, 12)
    layer = SVDLinear(base, r0=4, alpha=8.0)
    with torch.no_grad():
        layer.lam.copy_(torch.tensor([0.5, -1.25, 2.0, 0.0]))
    twin = SVDLinear(nn.Linear(16, 12), r0=4, alpha=8.0)
    twin.load_state_dict(layer.state_dict())
    return layer, twin


def _tweak(layer, scaled: bool):
    handle = types.SimpleNamespace(layers=[("m", layer)])
    step_profile._lam_cast(None, handle, scaled=scaled)


def _run(layer, x):
    out = layer(x)
    out.pow(2).sum().backward()
    return out, [p.grad.clone() for p in (layer.P, layer.lam, layer.Q)]


@pytest.mark.parametrize("scaled", [False, True])
def test_lam_cast_in_fp32(scaled):
    layer, twin = _pair()
    _tweak(twin, scaled)
    x = torch.randn(3, 5, 16)
    out, grads = _run(layer, x)
    out2, grads2 = _run(twin, x)
    if scaled:  # (h * (lam * s)) vs (h * lam) * s: rounding apart, nothing more
        torch.testing.assert_close(out2, out, rtol=1e-6, atol=1e-6)
        for g2, g in zip(grads2, grads):
            torch.testing.assert_close(g2, g, rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(out2, out)
        assert all(torch.equal(g2, g) for g2, g in zip(grads2, grads))
    # the adapter's part is really there: lam = 0 everywhere would make both trivially equal
    expected = layer.base(x) + (x @ layer.Q.T * layer.lam) @ layer.P.T * (8.0 / 4)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("scaled", [False, True])
def test_lam_cast_under_bf16_autocast_computes_eq3_to_bf16_rounding(scaled):
    layer, twin = _pair(1)
    _tweak(twin, scaled)
    x = torch.randn(2, 3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, out2 = layer(x), twin(x)
    assert out2.dtype == torch.bfloat16
    torch.testing.assert_close(out2.float(), out.float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(layer.delta_weight(), torch.zeros(12, 16))  # a real adapter term


def test_an_unknown_variant_is_one_line_before_any_model_is_built():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_profile.py"),
                           "--variants", "adalora-lamcast,nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--variants: unknown nope" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_plain_eq3_variant_is_svd_linear_before_its_autograd_function(amp):
    """The variant step_profile.py times against SVDLinear: the same bits, under autocast
    by another road (tests/methods/test_scaled_rank.py counts the operations each takes)."""
    layer, twin = _pair(2)
    step_profile._plain_eq3(None, types.SimpleNamespace(layers=[("m", twin)]))
    x = torch.randn(2, 3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out, grads = _run(layer, x)
        out2, grads2 = _run(twin, x)
    assert out.dtype == (torch.bfloat16 if amp else torch.float32)
    assert torch.equal(out2, out) and all(torch.equal(a, b) for a, b in zip(grads2, grads))
    # by another road under autocast: the variant has no ScaledRank node in its graph
    assert ("ScaledRankBackward" in _nodes(out)) == amp
    assert "ScaledRankBackward" not in _nodes(out2)


def _nodes(out: torch.Tensor) -> set[str]:
    """Names of the autograd nodes behind ``out``."""
    seen, todo = {}, [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and id(node) not in seen:
            seen[id(node)] = type(node).__name__
            todo.extend(n for n, _ in node.next_functions)
    return set(seen.values())
