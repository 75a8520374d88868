"""The training loop installs the rank-0 mask broadcast: in a real two-process run whose
ranks score the triplets differently, every rank keeps rank 0's mask at every mask event.

test_distributed checks the broadcast itself on an allocator; this checks that the loop
wires it in (``masks_from_rank0`` in ``loop._loop``), which no other distributed test
notices, since on a CPU both ranks' scores agree to the last bit anyway.
"""

from __future__ import annotations

import os

import pytest
import torch

from adalora_cli.methods.allocator import RankAllocator

from .conftest import forked_ranks
from .test_fsdp_run import train_args

pytestmark = pytest.mark.e2e  # two forked training processes


def test_every_rank_keeps_rank_0s_mask_where_their_scores_differ(tmp_path, in_repo, warm,
                                                                 monkeypatch):
    records = tmp_path / "masks"
    records.mkdir()
    scores, select = RankAllocator.scores, RankAllocator._select

    def skewed(self) -> torch.Tensor:
        """Each rank's scores times its own fixed factors in [1, 2): the ranks disagree on
        the order of the triplets, as GPU reductions can make them do in their last bits."""
        s = scores(self)
        rank = int(os.environ["RANK"])
        return s * (1 + torch.rand(s.shape, generator=torch.Generator().manual_seed(rank)))

    def recorded(self, b: int) -> None:
        own = torch.zeros_like(self.mask)  # what this rank's scores alone would keep
        own[torch.argsort(self.scores(), descending=True, stable=True)[:b]] = 1.0
        select(self, b)
        n = len(list(records.glob(f"rank{os.environ['RANK']}-*.pt")))
        torch.save({"own": own, "kept": self.mask.clone()},
                   records / f"rank{os.environ['RANK']}-{n}.pt")

    # patched before the fork: both ranks inherit them
    monkeypatch.setattr(RankAllocator, "scores", skewed)
    monkeypatch.setattr(RankAllocator, "_select", recorded)
    out = tmp_path / "run"
    codes = forked_ranks(train_args(out))  # DDP; T = 12: masks at steps 4, 6, 8 and 10
    zero, one = ([torch.load(records / f"rank{r}-{i}.pt")
                  for i in range(len(list(records.glob(f"rank{r}-*.pt"))))] for r in (0, 1))
    for step, (a, b) in enumerate(zip(zero, one)):
        assert torch.equal(a["kept"], a["own"]), step  # rank 0 keeps what it chose
        assert torch.equal(b["kept"], a["own"]), step  # and rank 1 keeps rank 0's choice
    # the test means something: rank 1's own choice differs from rank 0's at some event
    assert any(not torch.equal(a["own"], b["own"]) for a, b in zip(zero, one))
    assert codes == [0, 0] and len(zero) == len(one) == 4
    assert (out / "rank_pattern.json").is_file()

