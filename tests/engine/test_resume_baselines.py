"""Exact resume for the baselines that carry state beyond their trained tensors: SoRA (its
gates and ranks), IncreLoRA (the growth masks, the scores' EMAs and the generator that draws
new triplets), PiSSA (the frozen principal factors) and LoRA+ (its parameter groups). A run
SIGKILLed in the middle and resumed ends byte-identical to one never stopped."""

from __future__ import annotations

import pytest

from adalora_cli.rundir.run import is_finished

from .conftest import COMPARED, SMOKE, forked

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("method, kill", [
    ("increlora", "kill@step=9"),  # in the growth phase, between two growth events
    ("sora", "kill@step=11"),
    ("pissa", "kill@step=11"),
    ("loraplus", "kill@step=11"),
])
def test_a_killed_baseline_resumes_byte_identical(smoke, smoke_runs, tmp_path, method, kill):
    overrides = (f"method.name={method}", "train.save_every=3")
    baseline = smoke_runs(SMOKE, *overrides)
    out = tmp_path / "run"
    assert forked(smoke(out, *overrides), kill) == -9
    assert forked(["train", "--resume", str(out), "--quiet"]) == 0
    assert is_finished(out)
    present = [n for n in COMPARED if (baseline / n).exists()]  # no rank files for LoRA+
    assert [n for n in COMPARED if (out / n).exists()] == present
    assert [n for n in present if (out / n).read_bytes() != (baseline / n).read_bytes()] == []
