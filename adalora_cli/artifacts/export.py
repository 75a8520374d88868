"""``adalora export``: a finished run as a PEFT adapter, as a plain LoRA or as a merged
transformers model.

Every format starts from the run rebuilt by :func:`adalora_cli.artifacts.load.load_run`, so they
carry exactly the weights our own loader would use. The folder is written under a temporary
name beside the destination and renamed into place only when complete: an export that fails
half-way leaves nothing that looks like a finished export. The format writers live in
:mod:`.peft`, :mod:`.plain_lora` and :mod:`.merged`; which methods each format takes comes
from the method registry (``peft_type``, ``targeted``, ``mergeable``) and, for plain LoRA,
from the run's layers.

``adalora_cli.engine.outputs.export_facts`` is what ``train`` records in ``summary.json``
(``export``) so that an export never has to guess the base model, its revision, the adapted
modules or the method's hyperparameters. A run trained on a GGUF file gets its record
(file, sha256, and the hub repo or package it came from) beside either format as
``base_gguf.json``; its PEFT export names the hub repo and commit the file came from, or,
for a file from elsewhere, the dequantized base folder written once into the cache
(:mod:`.gguf_base`). Every export holds a model card, ``README.md`` (:mod:`.card`), and
``precision.json``: the precision the run's own scores came from, and how to run it so.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..errors import first_line, writing
from ..rundir.layout import SUMMARY
from ..rundir.run import RunDir, follow_umask, is_finished
from ..rundir.summary import Summary, read_summary
from .card import write_card

FORMATS = ("peft", "lora", "merged")
ADAPTER_FORMATS = ("peft", "lora")
"""The formats that write a PEFT adapter folder over a base the loader builds."""


def check_run(run_dir: Path) -> Summary:
    """The summary of a finished run; anything else is a one-line ConfigError."""
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist; pass a folder written "
                          "by `adalora train`")
    if not is_finished(run_dir):
        status = (RunDir.read_status(run_dir) or {}).get("status", "unknown")
        if status == "finished":  # the status says so, but the summary is gone
            raise ConfigError(f"{run_dir} says it finished but has no {SUMMARY} (deleted or "
                              "moved?); restore it, or train the run again")
        raise ConfigError(f"{run_dir} is not a finished run (status: {status}); wait for it "
                          "to finish or train it again")
    try:
        return read_summary(run_dir)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{run_dir / SUMMARY} cannot be read ({first_line(err)}); restore "
                          "it, or train the run again") from None


def check_destination(out: Path) -> None:
    if out.exists():
        raise ConfigError(f"{out} already exists; choose a new output folder (exports never "
                          "overwrite)")


def write_atomically(out: Path, write: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Run ``write(tmp)`` on a fresh folder beside ``out``, then rename it to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with writing(out, written_as=tmp):  # a full disk names the export, not tmp
            info = write(tmp)
        follow_umask(tmp)  # mkdtemp makes it 0700 and safetensors its files 0600
        check_destination(out)  # someone may have created it meanwhile
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def export_run(run_dir: str | Path, fmt: str, out: str | Path,
               note: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Export a finished run to ``out`` in ``fmt``; returns what was written. ``note`` hears
    about slow work done once (writing a GGUF base's dequantized folder)."""
    run_dir, out = Path(run_dir), Path(out)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use --format peft, --format lora or "
                          "--format merged")
    summary = check_run(run_dir)
    check_destination(out)
    method = summary.method
    if fmt == "peft":
        from .peft import check_peft_method, write_peft

        check_peft_method(method)
        writer = write_peft
    elif fmt == "lora":
        from .plain_lora import check_lora_method, write_lora

        check_lora_method(method)
        writer = write_lora
    else:
        from .merged import check_merge_method, write_merged

        check_merge_method(method)
        writer = write_merged
    from . import gguf_base
    from .load import load_run

    model, tokenizer, cfg = load_run(run_dir, "cpu")  # checks a GGUF base is unchanged
    model.eval()
    base, extra = gguf_base.recorded(run_dir), {}
    if base is not None and fmt in ADAPTER_FORMATS and base.get("repo"):
        # a hub repo's file: named by the repo and commit, which load anywhere (the card
        # says how: PEFT's own loader cannot read a GGUF repo)
        writer = functools.partial(writer, base=(base["repo"], base.get("revision")))
    elif base is not None and fmt in ADAPTER_FORMATS:  # PEFT loads a folder, not a GGUF file
        folder = str(gguf_base.dequantized_folder(cfg.model.name_or_path, base, note))
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name_or_path=folder))
        extra["base_folder"] = folder

    def write(tmp: Path) -> dict[str, Any]:
        info = writer(run_dir, model, tokenizer, cfg, summary, tmp)
        if base is not None:
            gguf_base.write_record(tmp, base, **extra)
        info["precision"] = write_precision(tmp, summary, fmt)
        info["card"] = str(write_card(tmp, fmt, cfg, summary, info, base, str(out),
                                      info.get("base")).name)
        return info

    info = write_atomically(out, write)
    return {"format": fmt, "out": str(out), **info, **extra}


def write_precision(folder: Path, summary: Summary, fmt: str) -> dict[str, Any]:
    """``precision.json``: the precision the run's own scores came from and how to run the
    export in it (a bf16 run scored in fp32 can answer differently); a model card
    (``README.md``) already written gets the same sentence."""
    import json

    from .scoring import PRECISION_FILE, precision_record

    record = precision_record(summary, fmt)
    (folder / PRECISION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    card = folder / "README.md"
    if card.is_file():
        with card.open("a", encoding="utf-8") as handle:
            handle.write(f"\n## Precision\n\n{record['how']}\n")
    return record
