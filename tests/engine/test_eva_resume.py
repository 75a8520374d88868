"""An EVA run killed after its pass and resumed: it takes its ranks from its checkpoint,
makes no new pass, and ends with the uninterrupted run's metrics, ranks and weights."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from adalora_cli.engine import calibration
from tests.engine.conftest import SMOKE, forked

EVA = ("method.name=eva", "eva.r=2", "train.save_every=3")


def test_a_killed_eva_run_resumes_to_the_uninterrupted_ones_files(smoke, smoke_runs,
                                                                  tmp_path, monkeypatch):
    whole = smoke_runs(SMOKE, *EVA)
    run = tmp_path / "run"
    assert forked(smoke(run, *EVA), fault="kill@step=10") == -9
    assert not (run / "summary.json").exists()

    def no_second_pass(*args, **kwargs):
        raise AssertionError("the resumed run passed over the data again")

    monkeypatch.setattr(calibration, "_run", no_second_pass)  # (the fork inherits it)
    assert forked(["train", "--resume", str(run), "--quiet"]) == 0
    for name in ("metrics.jsonl", "rank_pattern.json"):
        assert (run / name).read_bytes() == (whole / name).read_bytes(), name
    # bit for bit, as a LoRA run resumes: the pass's A is row-major like a loaded one
    resumed, uninterrupted = (load_file(str(p / "adapter_model.safetensors"))
                              for p in (run, whole))
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        assert torch.equal(tensor, uninterrupted[name]), name
