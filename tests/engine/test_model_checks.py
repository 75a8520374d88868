"""Models that cannot be trained as asked are refused before anything is written: one line,
exit 2, no run directory (a config.json naming no known architecture, an encoder or a
tokenizer without EOS for causal_lm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from tests.conftest import FIXTURES

runner = CliRunner()
SMOKE = {"causal_lm": "configs/smoke/causal_lm.yaml", "glue": "configs/smoke/glue.yaml"}
MODEL = {"causal_lm": FIXTURES / "tiny-llama", "glue": FIXTURES / "tiny-bert"}


def _model_with(tmp_path: Path, family: str, edit) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(MODEL[family], folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _refused(tmp_path: Path, family: str, *args: str) -> str:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", SMOKE[family], *args, "--run-dir", str(run_dir),
                                 "-q"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not run_dir.exists()
    return lines[0]


@pytest.mark.parametrize("family", ["causal_lm", "glue"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_an_unknown_model_type_is_bad_input(tmp_path, in_repo, family, dry_run) -> None:
    wrong = {"causal_lm": ("llamaa", "llama"), "glue": ("brt", "bert")}[family]
    folder = _model_with(tmp_path, family, lambda c: c.update(model_type=wrong[0]))
    line = _refused(tmp_path, family, f"model.name_or_path={folder}",
                    *(["--dry-run"] if dry_run else []))
    import transformers

    assert line == (f"error: {folder}/config.json has model_type {wrong[0]!r}, which "
                    f"transformers {transformers.__version__} does not know; did you mean "
                    f"{wrong[1]!r}? fix it, or upgrade transformers if the architecture is "
                    "newer")


@pytest.mark.parametrize("family", ["causal_lm", "glue"])
def test_a_config_without_model_type_is_bad_input(tmp_path, in_repo, family) -> None:
    folder = _model_with(tmp_path, family, lambda c: c.pop("model_type"))
    line = _refused(tmp_path, family, f"model.name_or_path={folder}")
    assert line == (f"error: {folder}/config.json has no model_type, so transformers cannot "
                    'tell which architecture it is; add one (e.g. "model_type": "llama") or '
                    "use the folder save_pretrained wrote")


def test_causal_lm_on_an_encoder_is_refused_up_front(tmp_path, in_repo) -> None:
    """A BERT (its tokenizer has a pad token but no EOS) used to pass every check and fail
    at the first batch with its run directory left failed."""
    for dry_run in ([], ["--dry-run"]):
        line = _refused(tmp_path, "causal_lm", f"model.name_or_path={MODEL['glue']}",
                        "method.name=lora", *dry_run)
        assert line == (f"error: model {MODEL['glue']} (bert) is an encoder (a masked language "
                        "model), which cannot learn to continue a text; causal_lm needs a "
                        "decoder-only model (Llama, Qwen, Mistral, GPT-2, ...)")


def test_causal_lm_needs_an_end_of_sequence_token(tmp_path, in_repo) -> None:
    """Configured as a decoder, the BERT passes as a model, but its tokenizer has no EOS to
    end the responses with."""
    folder = _model_with(tmp_path, "glue", lambda c: c.update(is_decoder=True))
    line = _refused(tmp_path, "causal_lm", f"model.name_or_path={folder}", "method.name=lora")
    assert line == (f"error: the tokenizer of {folder} has no end-of-sequence token, which "
                    "causal_lm ends every response with so the model learns to stop; use a "
                    "decoder model's tokenizer (or set eos_token in its tokenizer_config.json)")


def test_a_truncated_model_weights_file_is_named(tmp_path, in_repo) -> None:
    folder = _model_with(tmp_path, "glue", lambda c: None)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # an interrupted download
    line = _refused(tmp_path, "glue", f"model.name_or_path={folder}")
    assert line == (f"error: {weights} cannot be read (Error while deserializing header: "
                    "incomplete metadata, file not fully covered): it is damaged or truncated "
                    "(an interrupted download?); download or copy it again")
