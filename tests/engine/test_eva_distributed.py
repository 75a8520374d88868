"""EVA's pass on two processes (gloo, CPU): each process sees its slice of every batch, the
rows are gathered before each update, so both choose the ranks and the A one process
chooses on the same global batches; and EVA under train.sharding=fsdp is refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from adalora_cli.config import ConfigError
from adalora_cli.engine.sharding import check

from .conftest import SMOKE, forked, forked_ranks
from .test_sharding import CPU, TWO, _cfg, _ran


def eva_args(model, out, batch: int, *extra: str) -> list[str]:
    # max_steps=1: the pass's A is barely moved by the one step both runs take
    return ["train", SMOKE, f"model.name_or_path={model}", "method.name=eva", "eva.r=2",
            f"train.batch_size={batch}", "train.max_steps=1", *extra, "--run-dir", str(out),
            "--quiet"]


@pytest.mark.e2e
@pytest.mark.parametrize("nproc, batch", [
    (2, 16),
    # 64 rows in batches of 3: the last holds 1, and the other processes' shares of it are
    # stand-in examples of weight 0, which the pass must not see (nor hang on)
    (3, 3),
])
def test_several_processes_choose_the_ranks_and_A_one_process_does(no_dropout, in_repo, warm,
                                                                   tmp_path, nproc, batch):
    one, two = tmp_path / "one", tmp_path / "two"
    # tau = 1: no fit converges, so the pass reads every batch of the epoch, the last too
    assert forked(eva_args(no_dropout, one, batch, "eva.tau=1")) == 0
    assert forked_ranks(eva_args(no_dropout, two, batch, "eva.tau=1"), nproc) == [0] * nproc
    pattern = json.loads((one / "rank_pattern.json").read_text())
    assert json.loads((two / "rank_pattern.json").read_text()) == pattern
    assert len(set(pattern.values())) > 1  # a real redistribution, made twice alike
    a, b = (load_file(str(p / "adapter_model.safetensors")) for p in (one, two))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=0)


def test_eva_under_fsdp_is_refused_in_one_line(in_repo):
    cfg = _cfg("method.name=eva")
    with pytest.raises(ConfigError, match=r"^method\.name=eva does not run sharded yet; use "
                                          r"adalora, lora, adapters or bitfit"):
        check(cfg, TWO, _ran(cfg, CPU, None))
