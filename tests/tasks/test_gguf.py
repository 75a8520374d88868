"""GGUF input (adalora_cli/tasks/gguf.py): the tiny Llama written as a Q4_1 GGUF file by the
``gguf`` package loads with exactly the weights the package's own dequantizer gives, in the
dtype asked for, with the fixture's tokenizer and chat template; every way of naming the file
finds it; a missing extra is one line naming it; and the dequantized model saves as an
ordinary folder that reloads to the same logits."""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import ConfigError
from adalora_cli.tasks import gguf
from adalora_cli.tasks.pretrained import from_pretrained, load_config, load_tokenizer
from tests.conftest import FIXTURES
from tests.fixtures.make_tiny_gguf import dequantized_state

LLAMA = FIXTURES / "tiny-llama"
IDS = torch.tensor([[0, 5, 17, 99, 3, 250, 40, 301]])


def test_weights_are_the_files_blocks_dequantized(tiny_gguf):
    model = from_pretrained(AutoModelForCausalLM, str(tiny_gguf), torch.float32)
    expected = dequantized_state(tiny_gguf)
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    # quantized for real: Q4_1 moved the weights (the F32 down projection did not)
    original = AutoModelForCausalLM.from_pretrained(LLAMA, dtype=torch.float32).state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert 1e-4 < (state[q] - original[q]).abs().max() < 0.1
    down = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(state[down], original[down])
    # a plain model: no quantizer left to refuse save_pretrained or to wrap our adapters
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear


def test_the_config_is_the_checkpoints(tiny_gguf):
    ours, theirs = load_config(str(tiny_gguf)), load_config(str(LLAMA))
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
                "tie_word_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-7)  # float32 there


def test_dequantized_into_the_dtype_asked_for(tiny_gguf):
    model = from_pretrained(AutoModelForCausalLM, str(tiny_gguf), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    expected = dequantized_state(tiny_gguf)
    q = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(model.state_dict()[q], expected[q].to(torch.bfloat16))


def test_tokenizer_and_chat_template_come_from_the_file(tiny_gguf):
    ours, theirs = load_tokenizer(str(tiny_gguf)), AutoTokenizer.from_pretrained(LLAMA)
    text = "Which river runs through Morden? The Nene, 12 miles on."
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(
        chat, tokenize=False)
    assert (ours.eos_token, ours.pad_token, ours.bos_token) == ("</s>", "<pad>", "<s>")


def test_the_dequantized_model_saves_and_reloads_with_identical_logits(tiny_gguf, tmp_path):
    model = from_pretrained(AutoModelForCausalLM, str(tiny_gguf), torch.float32).eval()
    model.save_pretrained(tmp_path / "plain")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, again(IDS).logits)
    assert "quantization_config" not in json.loads((tmp_path / "plain/config.json").read_text())


# ------------------------------------------------------------------ naming the file


def test_every_way_of_naming_the_file_finds_it(tiny_gguf, tmp_path):
    path = str(tiny_gguf)
    assert gguf.locate(path) == path  # the .gguf path itself
    assert gguf.locate(str(tiny_gguf.parent), tiny_gguf.name) == path  # folder + gguf_file
    assert gguf.locate("ignored/for/a/path", path) == path  # gguf_file as a path
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "m.gguf").write_bytes(tiny_gguf.read_bytes())
    assert gguf.locate(str(alone)) == str(alone / "m.gguf")  # a folder holding only it
    assert gguf.locate(str(LLAMA)) == str(LLAMA)  # an ordinary folder is left alone
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "config.json").write_text("{}")
    (beside / "m.gguf").write_bytes(b"")
    assert gguf.locate(str(beside)) == str(beside)  # config.json decides: not a GGUF base


def test_bad_names_are_one_line_errors(tiny_gguf, tmp_path):
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"")
    with pytest.raises(ConfigError, match=r"holds 2 GGUF files .*a\.gguf, b\.gguf.*"
                                          r"model\.gguf_file=NAME"):
        gguf.locate(str(two))
    with pytest.raises(ConfigError, match=r"'c\.gguf' is not in .*it holds a\.gguf, b\.gguf"):
        gguf.locate(str(two), "c.gguf")
    with pytest.raises(ConfigError, match=r"is not a \.gguf file"):
        gguf.locate(str(two), "model.safetensors")
    with pytest.raises(ConfigError, match=r"GGUF file .*nope\.gguf does not exist"):
        gguf.locate(str(tmp_path / "nope.gguf"))
    with pytest.raises(ConfigError, match=r"model folder ./nowhere does not exist"):
        gguf.locate("./nowhere", "m.gguf")


def test_the_hash_is_the_files_sha256(tiny_gguf):
    facts = gguf.describe(str(tiny_gguf))
    data = tiny_gguf.read_bytes()
    assert facts == {"file": str(tiny_gguf.resolve()), "sha256": hashlib.sha256(data).hexdigest(),
                     "bytes": len(data)}


# ------------------------------------------------------------------ the gguf extra


class _Blocked(importlib.abc.MetaPathFinder):
    """Makes ``gguf`` look uninstalled."""

    def find_spec(self, name, path=None, target=None):
        if name == "gguf" or name.startswith("gguf."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def test_without_the_extra_training_stops_with_the_install_hint(tiny_gguf, tmp_path,
                                                                in_repo, monkeypatch):
    for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Blocked(), *sys.meta_path])
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "configs/smoke/causal_lm.yaml",
                                      f"model.name_or_path={tiny_gguf}", "--run-dir", str(run)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # the run's header (what runs, on which device, what loads) first, then the one error
    assert [line.split()[0] for line in lines[:-1]] == ["train", "device", "loading"]
    assert lines[-1:] == [f"error: {tiny_gguf} is a GGUF file; reading it needs the gguf "
                          "package: pip install -e '.[gguf]' (or make install)"], result.output
    assert not run.exists()  # refused before anything was written


@pytest.mark.parametrize("command", [["train"], ["train", "--dry-run"],
                                     ["sweep", "--budget", "14", "--dry-run"]])
def test_a_broken_gguf_file_is_one_line(tiny_gguf, tmp_path, in_repo, command):
    folder = tmp_path / "model"  # a folder holding only a .gguf: that file is the model
    folder.mkdir()
    (folder / "cut.gguf").write_bytes(tiny_gguf.read_bytes()[:2000])  # a partial download
    where = {"train": ["--run-dir", str(tmp_path / "out")],
             "sweep": ["--sweep-dir", str(tmp_path / "out")]}[command[0]]
    where = [] if "--dry-run" in command and command[0] == "train" else where
    result = CliRunner().invoke(app, [command[0], "configs/smoke/causal_lm.yaml",
                                      f"model.name_or_path={folder}", *command[1:], *where])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    header = ["train", "device", "loading"] if command == ["train"] else []  # a run's header
    assert [line.split()[0] for line in lines[:-1]] == header, result.output
    lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: could not read {folder / 'cut.gguf'} as a model ("), result.output
    assert lines[0].endswith("check that it is a complete GGUF file of an architecture "
                             "transformers supports")
    assert not (tmp_path / "out").exists()
