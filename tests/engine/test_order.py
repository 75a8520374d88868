"""The training order: the DataLoader's own shuffle by default, resumable mid-epoch, and
group_by_length batches of similar length, deterministic per seed."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from adalora_cli.engine.order import GROUP_WINDOW, EpochBatches


def order(loader) -> list[list[int]]:
    return [b.tolist() for b in loader]


def test_default_order_is_the_dataloaders_shuffle_epoch_after_epoch():
    data = list(range(45))
    g_ref, g_ours = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    reference = DataLoader(data, batch_size=8, shuffle=True, generator=g_ref)
    ours = DataLoader(data, batch_sampler=EpochBatches(data, 8, g_ours), generator=g_ours)
    for _ in range(3):
        assert order(ours) == order(reference)
    assert torch.equal(g_ref.get_state(), g_ours.get_state())


def test_resuming_mid_epoch_replays_the_rest_of_the_epoch():
    data = list(range(45))
    g = torch.Generator().manual_seed(1)
    batches = EpochBatches(data, 8, g)
    loader = DataLoader(data, batch_sampler=batches, generator=g)
    start = g.get_state()
    full = order(loader)
    after = g.get_state()
    g.set_state(start)  # what a resumed run does: the epoch's start state, then skip
    batches.skip = 4
    assert order(loader) == full[4:]
    assert torch.equal(g.get_state(), after)  # the next epoch draws the same order too
    assert order(loader) != full  # and skip applied once only


def test_group_by_length_batches_similar_lengths_and_uses_each_example_once():
    n, bs = 1000, 4
    lengths = [(i * 37) % 101 + 1 for i in range(n)]
    g = torch.Generator().manual_seed(0)
    batches = list(EpochBatches(range(n), bs, g, lengths))
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert len(batches) == n // bs and all(len(b) == bs for b in batches)
    # within a window the batches are sorted runs: the spread inside a batch is small
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches)
    assert spread / len(batches) < 3  # random batches of 4 spread ~ 50 on lengths 1..101
    # a batch never mixes two windows of GROUP_WINDOW batches of the epoch's permutation
    g.manual_seed(0)
    perm = torch.randperm(n, generator=g).tolist()
    window_of = {i: k // (bs * GROUP_WINDOW) for k, i in enumerate(perm)}
    assert all(len({window_of[i] for i in b}) == 1 for b in batches)
    # deterministic per seed, different across seeds
    again = list(EpochBatches(range(n), bs, torch.Generator().manual_seed(0), lengths))
    other = list(EpochBatches(range(n), bs, torch.Generator().manual_seed(1), lengths))
    assert again == batches and other != batches


@pytest.mark.e2e
def test_group_by_length_run_is_resumable_exactly(smoke, tmp_path):
    from .conftest import forked, same_outputs

    straight, killed = tmp_path / "a", tmp_path / "b"
    args = ("train.group_by_length=true", "train.save_every=5")
    assert forked(smoke(straight, *args)) == 0
    assert forked(smoke(killed, *args), "kill@step=13") == -9
    assert forked(["train", "--resume", str(killed), "--quiet"]) == 0
    assert same_outputs(straight, killed) == []

