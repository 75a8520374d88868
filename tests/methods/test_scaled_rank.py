"""Eq. 3's diag(lam) as one autograd function (adalora_cli/methods/scaled_rank.py) against
the plain ``(x @ Q.T) * lam`` it replaces: the same bits forward and backward, in fp32 and
under bf16 autocast, with fewer operations under autocast, and the same rank pattern and
weights from a bf16 smoke run."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.methods import adalora
from adalora_cli.methods.adalora import SVDLinear
from adalora_cli.methods.scaled_rank import ScaledRank, scaled_rank
from tests.conftest import ROOT
from tests.engine.conftest import COMPARED


def _plain(self: SVDLinear, x: torch.Tensor) -> torch.Tensor:
    """SVDLinear.forward as it was before scaled_rank: autograd's own multiply by lam."""
    z = (self.dropout(x) @ self.Q.T) * self.lam
    return self.base(x) + (z @ self.P.T) * self.scaling


def _layer(seed: int = 0) -> SVDLinear:
    torch.manual_seed(seed)
    layer = SVDLinear(nn.Linear(24, 20), r0=6, alpha=12.0)
    with torch.no_grad():  # a trained-looking lam, one triplet pruned
        layer.lam.copy_(torch.tensor([0.7, -1.3, 0.0, 2.1, -0.05, 0.4]))
    return layer


def _run(layer: SVDLinear, forward, x: torch.Tensor, amp: bool):
    """Output and the gradients of x, P, lam, Q under a loss that weighs every output."""
    for p in layer.parameters():
        p.grad = None
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out = forward(layer, x)
        loss = (out.float() * torch.linspace(-1, 1, out.shape[-1])).pow(2).sum()
    loss.backward()
    return [out, x.grad, layer.P.grad, layer.lam.grad, layer.Q.grad]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns: equal bits, not just equal values (-0.0 vs 0.0 differ)."""
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_svd_linear_forward_and_every_gradient_equal_the_plain_path_bit_for_bit(amp):
    layer = _layer()
    x = torch.randn(3, 7, 24)
    fused = _run(layer, SVDLinear.forward, x, amp)
    plain = _run(layer, _plain, x, amp)
    names = ["output", "x.grad", "P.grad", "lam.grad", "Q.grad"]
    for name, f, p in zip(names, fused, plain):
        assert f.dtype == p.dtype, name
        assert torch.equal(_bits(f), _bits(p)), name
    # what the importance scores read: lam's gradient in fp32, and a real one
    assert fused[3].dtype == torch.float32 and fused[3].abs().min() > 0
    assert fused[0].dtype == (torch.bfloat16 if amp else torch.float32)
    if amp:  # really bf16: the adapter's term is bf16-rounded, not fp32's
        exact = _run(layer, _plain, x, False)
        # bf16 keeps 8 significant bits (relative step 2**-8); two bf16 matmuls and the
        # rounding of x, Q and P to bf16 put each entry within a few such steps of fp32
        torch.testing.assert_close(fused[3], exact[3], rtol=3e-2, atol=1e-3)
        assert not torch.equal(fused[3], exact[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_function_itself_equals_multiply_then_cast(dtype):
    """ScaledRank called directly, fp32 included (where scaled_rank would not call it)."""
    g = torch.Generator().manual_seed(1)
    z0 = torch.randn(2, 5, 4, generator=g).to(dtype)
    lam0 = torch.tensor([1.5, -0.0, -2.25, 3e-3])
    grad = torch.randn(2, 5, 4, generator=g).to(dtype)
    results = []
    for fn in (ScaledRank.apply, lambda z, lam: (z * lam).to(z.dtype)):
        z, lam = z0.clone().requires_grad_(), lam0.clone().requires_grad_()
        out = fn(z, lam)
        out.backward(grad)
        results.append((out, z.grad, lam.grad))
    for f, p in zip(*results):
        assert f.dtype == p.dtype and torch.equal(_bits(f), _bits(p))
    assert results[0][2].dtype == torch.float32


def test_fp32_takes_autograds_own_multiply():
    z = torch.randn(3, 4, requires_grad=True)
    out = scaled_rank(z, torch.ones(4, requires_grad=True))
    assert type(out.grad_fn).__name__ == "MulBackward0"


class _Ops(TorchDispatchMode):
    """Counts the aten operations that compute (on a GPU: launch a kernel); views, frees
    and allocations launch none."""

    FREE = {"view", "_unsafe_view", "t", "permute", "expand", "detach", "empty_like"}

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _count(forward, amp: bool) -> collections.Counter:
    """Operations of one forward and backward of an SVDLinear, the loss's own included."""
    layer = _layer()
    x = torch.randn(2, 3, 24, requires_grad=True)
    with _Ops() as mode:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = forward(layer, x)
        out.sum().backward()
    return mode.ops


def test_under_autocast_three_operations_fewer_per_matrix_and_none_in_fp32():
    _count(SVDLinear.forward, True)  # scaled_rank's fp32 zero, made once per device
    fused, plain = _count(SVDLinear.forward, True), _count(_plain, True)
    # the plain path's extra: lam's fp32 product cast down for P's matmul, its gradient
    # cast up, the gradient for z multiplied and cast down, and lam's gradient a multiply
    # and a sum; the fused one: a multiply each way, and lam's gradient an addcmul and a sum
    assert plain - fused == collections.Counter({"_to_copy": 3, "mul": 1})
    assert fused - plain == collections.Counter({"addcmul": 1})
    assert sum(plain.values()) - sum(fused.values()) == 3
    # fp32: the very same operations as before
    assert _count(SVDLinear.forward, False) == _count(_plain, False)


def test_a_bf16_smoke_run_keeps_its_rank_pattern_and_weights(smoke_runs, tmp_path,
                                                             monkeypatch):
    """The allocator's masks (rank_history, rank_pattern) and everything else the run writes
    are byte-identical with the plain multiply, on a run that prunes 48 -> 16 triplets."""
    config, bf16 = "configs/smoke/glue.yaml", "train.precision=bf16"
    fused = smoke_runs(config, bf16)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(adalora.SVDLinear, "forward", _plain)
    result = CliRunner().invoke(app, ["train", config, bf16, "--run-dir",
                                      str(tmp_path / "plain"), "--quiet"])
    assert result.exit_code == 0, result.output
    for name in COMPARED:
        assert (fused / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    # the run did prune under bf16: b(T) = 16 of the 12 matrices x r0 4 = 48 triplets
    assert sum(json.loads((fused / "rank_pattern.json").read_text()).values()) == 16
    assert "precision: bf16" in (fused / "config.yaml").read_text()


@pytest.mark.slow  # inductor writes and builds C++ for the layer: a minute on 2 cores
def test_torch_compile_traces_the_function_in_one_graph():
    """compile_step.py and a GPU's CUDA graphs need the whole step traced: the function
    (its out= products included) compiles with fullgraph=True, i.e. without a graph break,
    and the compiled layer computes what the eager one does, to bf16's rounding (inductor
    may fuse the products in another order; 8 significant bits give rtol 2**-7)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    layer = _layer(3)
    x = torch.randn(2, 5, 24)
    eager = _run(layer, SVDLinear.forward, x, True)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    fused = _run(layer, lambda module, inp: compiled(inp), x, True)
    assert counter.frame_count == 1
    for name, f, e in zip(["output", "x.grad", "P.grad", "lam.grad", "Q.grad"], fused, eager):
        assert f.dtype == e.dtype, name
        torch.testing.assert_close(f, e, rtol=2**-7, atol=1e-4, msg=name)
