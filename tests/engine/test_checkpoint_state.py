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
