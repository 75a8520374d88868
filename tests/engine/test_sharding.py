"""engine/sharding.py without processes: which blocks are sharded, what is refused and how
it is said, the rows each process holds, and how ``train.sharding`` enters a run's identity.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from adalora_cli.config import ConfigError, apply_overrides, from_dict, load_config
from adalora_cli.engine import checkpoint as ckpt
from adalora_cli.engine.distributed import World
from adalora_cli.engine.precision import Precision
from adalora_cli.engine.sharding import _rows, check, find_blocks, model_class
from adalora_cli.methods.registry import config_digest

from .conftest import SMOKE

TWO = World(0, 2, 0)
CPU = torch.device("cpu")
NONE_HINT = "or set train.sharding=none (each process then holds the whole model)"


def _cfg(*overrides: str):
    return load_config(SMOKE, ["train.sharding=fsdp", *overrides])


def _ran(cfg, device: torch.device, amp: torch.dtype | None) -> Precision:
    """The build's record of a run of ``cfg`` whose autocast is ``amp`` on ``device``."""
    autocast = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp]
    return Precision(cfg.train.precision, device, autocast)


def test_blocks_are_the_transformer_layers(tiny_bert, fixtures, in_repo):
    from transformers import AutoModelForSequenceClassification

    bert = AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    # BertModel names its embeddings and its layers in _no_split_modules
    assert find_blocks(bert) == [bert.bert.embeddings, *bert.bert.encoder.layer]
    bert._no_split_modules = bert.bert._no_split_modules = None
    assert find_blocks(bert) == list(bert.bert.encoder.layer)  # a list of identical layers
    bart = AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(fixtures / "tiny-bart"))
    assert find_blocks(bart) == [*bart.model.encoder.layers, *bart.model.decoder.layers]
    llama = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(fixtures / "tiny-llama"))  # named in _no_split_modules
    assert find_blocks(llama) == list(llama.model.layers)


def test_a_block_inside_a_block_is_not_sharded_twice():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    model = nn.Sequential(nn.ModuleList([Block(), Block()]))
    assert find_blocks(model) == list(model[0])


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ConfigError) as err:
        find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)))
    assert str(err.value) == (
        "train.sharding=fsdp found no transformer blocks to shard in Sequential (no "
        "_no_split_modules, no list of identical layers); " + NONE_HINT)


@pytest.mark.parametrize(("overrides", "world", "device", "amp", "message"), [
    ([], World(), CPU, None,
     "train.sharding=fsdp shards the model across processes, but this run has one: start it "
     "with --nproc N (N >= 2) or torchrun, " + NONE_HINT),
    (["method.name=full"], TWO, CPU, None,
     "method.name=full trains and saves the whole model, which train.sharding=fsdp does not "
     "gather; use a parameter-efficient method (adalora, lora, adapters, bitfit) " + NONE_HINT),
    (["method.name=sora"], TWO, CPU, None,
     "method.name=sora does not run sharded yet; use adalora, lora, adapters or bitfit, "
     + NONE_HINT),
    ([], TWO, torch.device("mps"), None,
     "train.sharding=fsdp runs on CUDA or the CPU, not on mps; set train.device=cuda (or "
     "cpu), " + NONE_HINT),
    (["train.precision=fp16"], TWO, CPU, torch.float16,
     "train.sharding=fsdp does not run fp16 (its loss scaler is not sharding-aware): set "
     "train.precision=bf16 (or fp32), " + NONE_HINT),
    (["train.precision=auto"], TWO, CPU, torch.float16,
     "train.sharding=fsdp does not run fp16 (its loss scaler is not sharding-aware), which "
     "train.precision=auto picks on a GPU below compute capability 8.0: set "
     "train.precision=fp32 (or bf16, emulated there), " + NONE_HINT),
])
def test_what_fsdp_cannot_run_is_refused_in_one_line(in_repo, overrides, world, device, amp,
                                                     message):
    with pytest.raises(ConfigError) as err:
        cfg = _cfg(*overrides)
        check(cfg, world, _ran(cfg, device, amp))
    assert str(err.value) == message


@pytest.mark.parametrize("method", ["rslora", "dora", "pissa", "loraplus", "sora",
                                    "increlora"])
def test_todays_baselines_are_refused_sharded(in_repo, method):
    with pytest.raises(ConfigError, match=f"^method.name={method} does not run sharded yet"):
        cfg = _cfg(f"method.name={method}")
        check(cfg, TWO, _ran(cfg, CPU, torch.bfloat16))


def test_what_fsdp_runs_passes(in_repo):
    for method in ("adalora", "lora", "houlsby", "pfeiffer", "bitfit"):
        cfg = _cfg(f"method.name={method}")
        check(cfg, TWO, _ran(cfg, CPU, torch.bfloat16))
    cfg = load_config(SMOKE, ["method.name=full"])
    check(cfg, World(), _ran(cfg, CPU, torch.float16))  # not sharded


@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 37])
@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_rows_are_torch_chunks(n, size):
    chunks = list(torch.arange(n).chunk(size))
    for rank in range(size):
        lo, hi = _rows(n, size, rank)
        held = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(range(lo, hi)) == held


def test_the_model_class_is_the_models_own_not_fsdps():
    from torch.distributed.fsdp import FSDPModule

    class Model(nn.Module):
        pass

    wrapped = type("FSDPModel", (FSDPModule, Model), {})  # what fully_shard swaps in
    assert model_class(wrapped()) is Model
    assert model_class(Model()) is Model


def test_sharding_is_how_a_run_goes_not_what_it_computes(in_repo):
    cfg = load_config(SMOKE)
    fsdp = from_dict(apply_overrides(cfg.to_dict(), ["train.sharding=fsdp"]))
    assert config_digest(fsdp) == config_digest(cfg)  # seeds of one experiment
    assert ckpt.resume_digest(fsdp) == ckpt.resume_digest(cfg)  # old checkpoints resume
    with pytest.raises(ConfigError, match="train.sharding"):
        load_config(SMOKE, ["train.sharding=ddp"])


def test_a_checkpoint_resumes_only_under_its_own_sharding(tmp_path, in_repo):
    path = tmp_path / "run" / "checkpoints" / "step-0000004"
    whole, fsdp = load_config(SMOKE), _cfg()
    ckpt.check_sharding(path, {}, whole)  # written before sharding existed: whole
    ckpt.check_sharding(path, {"sharding": "fsdp"}, fsdp)
    with pytest.raises(ConfigError) as err:
        ckpt.check_sharding(path, {"sharding": "none"}, fsdp)
    assert str(err.value) == (
        f"step-0000004 of {tmp_path / 'run'} was written whole (train.sharding=none, one "
        "process or DDP) and cannot resume sharded; resume it with train.sharding=none, or "
        "start a new run with train.sharding=fsdp")
    with pytest.raises(ConfigError) as err:
        ckpt.check_sharding(path, {"sharding": "fsdp", "world_size": 3}, whole)
    assert str(err.value) == (
        f"step-0000004 of {tmp_path / 'run'} was written sharded (train.sharding=fsdp) by 3 "
        f"processes and resumes only sharded, on 2 or more; resume it with adalora train "
        f"--resume {tmp_path / 'run'} train.sharding=fsdp --nproc 3")
    with pytest.raises(ConfigError) as err:  # sharded, but on one process
        ckpt.check_sharding(path, {"sharding": "fsdp", "world_size": 2}, fsdp, processes=1)
    assert str(err.value).endswith(f"resume it with adalora train --resume {tmp_path / 'run'} "
                                   "--nproc 2")
