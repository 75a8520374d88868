"""``engine/checkpoint.py`` in process: a saved checkpoint loads back equal (tensors,
optimizer, scheduler, scaler, RNGs, data position), only the newest ``keep`` stay, and a
torn or unpublished folder is never taken for the latest."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from torch import nn

from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.engine.faults import ENV as FAULT_ENV


def same(a, b) -> bool:
    """Deep equality that compares tensors and arrays by value (and dtype)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def trained(seed: int = 0):
    """A layer, its AdamW (with moments), LambdaLR and scaler after two steps."""
    torch.manual_seed(seed)
    layer = nn.Linear(4, 3)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for _ in range(2):
        loss = layer(torch.randn(5, 4)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return layer, opt, sched, scaler


def state_of(opt, sched, scaler, step_seconds: float = 12.5) -> dict:
    """What the loop puts next to the tensors (loop.py's _save), with a real data position."""
    gen = torch.Generator().manual_seed(7)
    return {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict(), "allocator": None, "rng": ckpt.rng_state(),
            "data": {"epoch": 2, "epoch_start": gen.get_state(), "consumed": 3,
                     "generator": gen.get_state()},
            "streams": {"metrics.jsonl": 1234, "rank_history.jsonl": 56},
            "eval_pending": False, "train_seconds": step_seconds}


def tensors_of(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in layer.state_dict().items()}


def test_round_trip_restores_everything_the_next_step_depends_on(tmp_path):
    layer, opt, sched, scaler = trained()
    tensors, state = tensors_of(layer), state_of(opt, sched, scaler)
    path = ckpt.save_checkpoint(tmp_path, 2, tensors, state, keep=3)
    assert path == tmp_path / "checkpoints" / "step-0000002"

    loaded_tensors, loaded = ckpt.load_checkpoint(path)
    assert same(loaded_tensors, tensors)
    assert loaded.pop("format") == ckpt.FORMAT and loaded.pop("step") == 2
    assert same(loaded, state)

    # the loaded state really resumes: the same next step as the run that kept going
    batch = torch.randn(5, 4)
    layer2, opt2, sched2, scaler2 = trained(seed=1)  # other weights and moments
    layer2.load_state_dict(loaded_tensors)
    opt2.load_state_dict(loaded["optimizer"])
    sched2.load_state_dict(loaded["scheduler"])
    scaler2.load_state_dict(loaded["scaler"])
    for lyr, o, s, sc in ((layer, opt, sched, scaler), (layer2, opt2, sched2, scaler2)):
        sc.scale(lyr(batch).pow(2).mean()).backward()
        sc.step(o)
        sc.update()
        s.step()
    assert same(tensors_of(layer2), tensors_of(layer))
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    path = ckpt.save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"rng": ckpt.rng_state()},
                                keep=1)
    draws = (random.random(), np.random.rand(3), torch.rand(3))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    ckpt.set_rng_state(ckpt.load_checkpoint(path)[1]["rng"])
    assert same((random.random(), np.random.rand(3), torch.rand(3)), draws)


def test_only_the_newest_keep_remain(tmp_path):
    for step in range(1, 6):
        ckpt.save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))},
                             {"n": step}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-0000004", "step-0000005"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step-0000005"
    # saving the same step again (the end of a run that just checkpointed) replaces it
    ckpt.save_checkpoint(tmp_path, 5, {"w": torch.full((2,), 50.0)}, {"n": 50}, keep=2)
    tensors, state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))
    assert torch.equal(tensors["w"], torch.full((2,), 50.0)) and state["n"] == 50
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names


def test_a_torn_or_unpublished_folder_is_not_the_latest(tmp_path):
    assert ckpt.latest_checkpoint(tmp_path) is None  # no checkpoints/ at all
    good = ckpt.save_checkpoint(tmp_path, 5, {"w": torch.ones(2)}, {"n": 5}, keep=3)
    root = tmp_path / "checkpoints"
    # a later step whose state.pt never got written (a folder torn by hand or by a disk)
    torn = root / "step-0000009"
    torn.mkdir()
    (torn / ckpt.TENSORS).write_bytes((good / ckpt.TENSORS).read_bytes())
    # a complete but unpublished write, left by a process killed before its rename
    partial = root / ".partial-step-0000012-4242"
    partial.mkdir()
    for name in (ckpt.TENSORS, ckpt.STATE):
        (partial / name).write_bytes((good / name).read_bytes())
    (root / "step-00000x1").mkdir()  # not a step number
    assert ckpt.latest_checkpoint(tmp_path) == good
    # the next save clears the stale partial write and publishes its own step
    newer = ckpt.save_checkpoint(tmp_path, 6, {"w": torch.ones(2)}, {"n": 6}, keep=3)
    assert not partial.exists() and ckpt.latest_checkpoint(tmp_path) == newer


def test_a_write_that_fails_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch):
    good = ckpt.save_checkpoint(tmp_path, 3, {"w": torch.ones(2)}, {"n": 3}, keep=3)
    monkeypatch.setenv(FAULT_ENV, "enospc@checkpoint=6")  # the disk fills while writing
    with pytest.raises(OSError, match="No space left"):
        ckpt.save_checkpoint(tmp_path, 6, {"w": torch.ones(2)}, {"n": 6}, keep=3)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [good.name]
    assert ckpt.latest_checkpoint(tmp_path) == good


def test_another_format_is_refused_by_name(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, 1, {"w": torch.ones(1)}, {}, keep=1)
    state = torch.load(path / ckpt.STATE, weights_only=True)
    torch.save({**state, "format": ckpt.FORMAT + 1}, path / ckpt.STATE)
    message = f"{path} has checkpoint format {ckpt.FORMAT + 1}, this version reads 2 and 3"
    with pytest.raises(ValueError, match=re.escape(message)):
        ckpt.load_checkpoint(path)
