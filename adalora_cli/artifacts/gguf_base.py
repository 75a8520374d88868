"""What exports of a run trained on a GGUF file record and name as its base.

A run on a GGUF base records the file and its sha256 (``summary.json``, ``export.base_gguf``);
before an export or a prediction rebuilds the run, :func:`check_unchanged` makes sure the file
at that path still holds those bytes, since an adapter laid on other weights is silently
wrong. Every export of such a run gets the record as ``base_gguf.json``.

PEFT rebuilds a base with ``AutoModelFor....from_pretrained(base_model_name_or_path)``, which
reads folders, not GGUF files. So the PEFT export names an ordinary transformers folder
holding the dequantized base: written once per GGUF file (keyed by its hash) under the cache
(:func:`cache_root`), fp32 as dequantized, with the tokenizer, and reused by every later
export of a run on the same file. Loaded with transformers' GGUF reader and saved with
``save_pretrained``, it reloads with exactly the weights a run trains on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from ..rundir.run import follow_umask
from ..rundir.summary import read_summary
from ..tasks import gguf
from ..tasks.pretrained import from_pretrained, load_config, load_tokenizer

RECORD = "base_gguf.json"
"""The GGUF base's file, sha256 and size, beside every export of a run trained on one."""
CACHE_ENV = "ADALORA_CACHE"


def cache_root() -> Path:
    """``$ADALORA_CACHE``, else ``$XDG_CACHE_HOME/adalora``, else ``~/.cache/adalora``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "adalora"


def recorded(run_dir: Path) -> dict[str, Any] | None:
    """The GGUF base a finished run recorded, or None (another base, or no summary)."""
    try:
        base = read_summary(run_dir).export.base_gguf
    except (OSError, ValueError):
        return None
    return base if isinstance(base, dict) and base.get("sha256") else None


def check_unchanged(run_dir: Path, path: str) -> dict[str, Any] | None:
    """The run's recorded GGUF base, after checking that ``path`` still holds it."""
    base = recorded(run_dir)
    if base is None or not gguf.is_gguf(path):
        return base
    now = gguf.describe(path)
    if now["sha256"] != base["sha256"]:
        raise ConfigError(f"{path} is not the GGUF file run {run_dir} was trained on (sha256 "
                          f"{now['sha256'][:12]}..., recorded {base['sha256'][:12]}...); "
                          "restore that file, or train the run again on this one")
    return base


def write_record(out: Path, base: dict[str, Any], **extra: Any) -> None:
    (out / RECORD).write_text(json.dumps({**base, "dequantized_to": "float32", **extra},
                                         indent=2) + "\n")


def dequantized_folder(path: str, base: dict[str, Any], note=lambda text: None) -> Path:
    """A transformers folder holding the GGUF file at ``path`` dequantized (fp32), written
    once into the cache and reused; ``note`` hears when it is written."""
    folder = cache_root() / "gguf" / f"{Path(path).stem}-{base['sha256'][:16]}"
    if (folder / "config.json").is_file():  # renamed into place only when complete
        return folder
    note(f"writing the dequantized base of {Path(path).name} once to {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        _write_base(path, tmp)
        write_record(tmp, base)
        follow_umask(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another export wrote it meanwhile: keep theirs
            if not (folder / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _write_base(path: str, out: Path) -> None:
    """The whole pretrained model in the file (its LM head included), as PEFT's auto
    classes load a base folder for any task type."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = load_config(path)
    auto = (AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False)
            else AutoModelForCausalLM)
    model = from_pretrained(auto, path, torch.float32, config=config)
    model.save_pretrained(out, safe_serialization=True)
    load_tokenizer(path).save_pretrained(out)
