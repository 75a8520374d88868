"""``checkpoint.state_of`` / ``restore``: what a checkpoint saves besides the tensors comes
back whole, on objects built fresh (as a resumed run builds them)."""

from __future__ import annotations

import random

import torch

from adalora_cli.engine import checkpoint as ckpt
from tests.engine.test_step import tiny_stepper
from tests.methods._tiny import tiny_batch


def stepped(n: int):
    stepper = tiny_stepper()
    for t in range(1, n + 1):
        stepper.backward_pieces([(tiny_batch(t), 1.0)])
        stepper.update(t)
    return stepper


def test_state_round_trips_through_a_checkpoint(tmp_path):
    stepper = stepped(7)  # past t_init: the allocator has scores and a mask
    generator = torch.Generator().manual_seed(3)
    epoch_start = generator.get_state()
    torch.randperm(10, generator=generator)
    pos = ckpt.Position(step=7, epoch=1, consumed=5, epoch_start=epoch_start,
                        seconds_now=12.5)
    random.seed(11)
    rng = ckpt.rng_state()
    state = ckpt.state_of(stepper, generator, pos, [rng], {"metrics.jsonl": 321})
    path = ckpt.save_checkpoint(tmp_path, 7, {"w": torch.zeros(2)}, state, keep=1)
    after_save = random.random()

    fresh = tiny_stepper()
    random.seed(99)
    _, loaded = ckpt.load_checkpoint(path)
    back = ckpt.restore(loaded, fresh)
    assert random.random() == after_save  # every RNG is back where it was saved
    assert (back.step, back.epoch, back.consumed, back.saved_step) == (7, 1, 5, 7)
    assert torch.equal(back.epoch_start, epoch_start) and back.seconds == 12.5
    assert back.eval_pending is False and loaded["streams"] == {"metrics.jsonl": 321}
    assert torch.equal(loaded["data"]["generator"], generator.get_state())
    assert fresh.scheduler.last_epoch == 7
    for a, b in zip(stepper.optimizer.state.values(), fresh.optimizer.state.values(),
                    strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    assert torch.equal(fresh.handle.allocator.mask, stepper.handle.allocator.mask)
    assert fresh.handle.allocator.rank_pattern() == stepper.handle.allocator.rank_pattern()


def test_a_cut_evaluation_is_saved_pending():
    stepper = stepped(1)
    state = ckpt.state_of(stepper, torch.Generator(), ckpt.Position(step=1), [ckpt.rng_state()],
                          {}, eval_pending=True)
    assert ckpt.restore({**state, "step": 1}, tiny_stepper()).eval_pending is True


def test_the_loss_scaler_s_skips_and_the_machine_are_saved():
    stepper = stepped(1)
    stepper.skipped, stepper.skip_run, stepper.precision = 5, 2, "fp16"
    rngs = [ckpt.rng_state(), ckpt.rng_state()]  # written by two processes
    state = {**ckpt.state_of(stepper, torch.Generator(), ckpt.Position(step=1), rngs, {}),
             "step": 1}
    assert (state["world_size"], state["precision"]) == (2, "fp16")
    fresh = tiny_stepper()
    ckpt.restore(state, fresh)
    assert (fresh.skipped, fresh.skip_run) == (5, 2)
    # a checkpoint from before these fields: its world size is its number of RNG states
    old = {k: v for k, v in state.items() if k not in ("world_size", "precision", "skipped")}
    assert ckpt.saved_world_size(old) == 2
    ckpt.restore(old, fresh)
    assert (fresh.skipped, fresh.skip_run) == (0, 0)


def test_a_scaler_saved_without_loss_scaling_leaves_a_new_one_fresh():
    """A bf16 run resumed where auto gives fp16 (another GPU): the saved scaler state is
    empty, and the fp16 scaler starts from its initial scale instead of failing."""
    stepper = stepped(1)  # a disabled scaler (CPU): its state is {}
    state = {**ckpt.state_of(stepper, torch.Generator(), ckpt.Position(step=1),
                             [ckpt.rng_state()], {}), "step": 1}
    fresh = tiny_stepper()
    fresh.scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    ckpt.restore(state, fresh)
    assert fresh.scaler.get_scale() == 512.0


def test_machine_changes_are_named_in_one_line():
    state = {"world_size": 2, "precision": "bf16", "rng": [{}, {}]}
    assert ckpt.machine_changes(state, 2, "bf16") == {}
    changes = ckpt.machine_changes(state, 1, "fp16")
    assert changes == {"processes": [2, 1], "precision": ["bf16", "fp16"]}
    assert ckpt.describe_machine_changes(changes) == (
        "resuming on 1 process a checkpoint written by 2: the weights, optimizer, lr and "
        "budget schedules, rank allocator and data order carry on exactly, but each "
        "process's random stream (dropout) and the sum of gradients over processes cannot, "
        "so the run matches an uninterrupted one only up to those; this device runs fp16 "
        "autocast where the checkpoint ran bf16 autocast: the run goes on so, with a fresh "
        "loss scaler")
    assert "\n" not in ckpt.describe_machine_changes(changes)
    assert ckpt.describe_machine_changes({"processes": [1, 4]}).startswith(
        "resuming on 4 processes a checkpoint written by 1:")
    assert ckpt.describe_machine_changes({"precision": ["fp16", "fp32"]}) == (
        "this device runs fp32 where the checkpoint ran fp16 autocast: the run goes on so, "
        "without its loss scaler")


def _state(stepper) -> dict:
    generator = torch.Generator().manual_seed(3)
    pos = ckpt.Position(step=3, epoch=0, consumed=3, epoch_start=generator.get_state())
    # the step is added by save_checkpoint
    return {**ckpt.state_of(stepper, generator, pos, [ckpt.rng_state()], {}), "step": 3}


def _fused(stepper, scaled: bool):
    """``stepper`` with AdamW as Stepper.build makes it on CUDA (fused; torch has a fused
    CPU kernel too), and under fp16 a live loss scaler."""
    stepper.optimizer = torch.optim.AdamW(stepper.handle.trainable, lr=0.01,
                                          weight_decay=0.1, fused=True)
    stepper.scheduler = torch.optim.lr_scheduler.LambdaLR(stepper.optimizer, lambda s: 1.0)
    if scaled:
        stepper.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    return stepper


def test_a_resumed_optimizer_keeps_this_machines_kernels():
    """A checkpoint from the CPU (torch's default AdamW) resumed where the step is fused
    (CUDA) stays fused, and its first step under loss scaling runs (the scaler hands a fused
    step its overflow flag; an unfused one refuses it); the other way round stays unfused.
    The moments come back either way."""
    saved = _state(stepped(3))
    fresh = _fused(tiny_stepper(), scaled=True)
    ckpt.restore(saved, fresh)
    group = fresh.optimizer.param_groups[0]
    assert group["fused"] is True and not group["foreach"]
    p = fresh.handle.trainable[0]
    assert torch.equal(fresh.optimizer.state[p]["exp_avg"],
                       saved["optimizer"]["state"][0]["exp_avg"])
    assert saved["optimizer"]["param_groups"][0]["fused"] is None  # the input is untouched
    fresh.backward_pieces([(tiny_batch(4), 1.0)])
    before = p.detach().clone()
    assert not fresh.update(4).skipped
    assert not torch.equal(p.detach(), before)  # it stepped

    fused = _fused(tiny_stepper(), scaled=False)
    for t in (1, 2):
        fused.backward_pieces([(tiny_batch(t), 1.0)])
        fused.update(t)
    back = tiny_stepper()
    ckpt.restore(_state(fused), back)
    assert back.optimizer.param_groups[0]["fused"] is None
