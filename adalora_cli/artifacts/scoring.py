"""How ``adalora eval`` and ``adalora predict`` run a finished model: on which device, in
which autocast precision, and with its frozen base in which dtype.

A run's own scores (``summary.json``, ``predictions.jsonl``) come from the precision it
trained in: under ``train.precision=auto`` bf16 autocast on a GPU from the A100 on and on a
CPU with native bf16, fp32 elsewhere, and under ``model.base_dtype=auto`` a bf16 base beside
bf16 autocast. Scored in another precision the same weights give other logits in the last
digits, enough to change a greedy reply or a near-tie label. So both commands score as the
run did (``precision`` in its summary.json) unless told otherwise, and say which; where the
device cannot run the run's precision (fp16 autocast on a CPU) they run fp32 and say that
the scores may differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ConfigError, RunConfig
from ..rundir.summary import Summary

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_WORDS = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}


@dataclass(frozen=True)
class Scoring:
    """What a finished run is scored with, decided once per command."""

    device: torch.device
    precision: str
    """The autocast precision that runs: fp32, bf16 or fp16."""
    base_dtype: torch.dtype
    """The dtype of the frozen base weights (adapters and head stay fp32)."""
    as_run: bool
    """True when precision and base dtype are those the run's own scores came from."""
    line: str
    """One line for the user: what runs, and whether it is the run's own precision."""

    @property
    def autocast(self) -> Callable[[], Any]:
        from ..engine.precision import Precision

        return Precision(self.precision, self.device, self.precision).context()

    def record(self) -> dict[str, Any]:
        """For ``eval/<name>.json``: what the scores were computed with."""
        from ..engine.precision import dtype_name

        return {"device": str(self.device), "autocast": self.precision,
                "base_dtype": dtype_name(self.base_dtype), "as_run": self.as_run}


def check_precision(value: str, setting: str) -> None:
    if value not in PRECISIONS:
        raise ConfigError(f"{setting} {value!r} is not a precision; use fp32, bf16, fp16 or "
                          "auto (default: the run's own)")


def predict_device(cfg: RunConfig, asked: str | None) -> torch.device:
    """``--device`` when given, else the device the run's ``train.device`` names here
    (``auto``: CUDA when present), as training picked it."""
    from ..engine.build import pick_device

    if asked is not None:
        return pick_device(asked, setting="--device")
    try:
        return pick_device(cfg.train.device)
    except ConfigError:
        raise ConfigError(f"the run trained with train.device={cfg.train.device}, which this "
                          "machine does not have; pass --device cpu (or another device)"
                          ) from None


def ran_with(cfg: RunConfig, summary: Summary, device: torch.device) -> tuple[str, str]:
    """(autocast, base dtype) the run's scores came from, in the config's words: as its
    summary records them, else (a run older than that record) as its config resolves on
    ``device``."""
    from ..engine.precision import as_configured

    ran = summary.precision or {}
    if ran.get("autocast") in _WORDS and ran.get("base_dtype") in _WORDS:
        return ran["autocast"], ran["base_dtype"]
    return as_configured(cfg, device)


def choose(cfg: RunConfig, summary: Summary, device: torch.device, asked: str | None,
           option: Callable[[str], str]) -> Scoring:
    """The scoring of a finished run on ``device``: the run's own precision, or ``asked``
    (a ``train.precision`` value) when given. ``option(value)`` writes the setting as the
    user would (``--precision fp32``, ``train.precision=fp32``) for the line."""
    from ..engine.precision import cpu_bf16_native, resolve

    ran, ran_base = ran_with(cfg, summary, device)
    precision = resolve(asked or ran, device)
    # a half-precision base only where the run had one under this same autocast
    base = ran_base if precision == ran and precision != "fp32" else "fp32"
    as_run = precision == ran and base == ran_base
    what = _WORDS[precision] + (f" (base weights in {base})" if base != "fp32" else "")
    if as_run:
        line = f"scoring on {device} in {what}, as the run scored"
        if precision != "fp32":
            line += f" ({option('fp32')} for full precision)"
    else:
        before = _WORDS[ran] + (f" (base weights in {ran_base})" if ran_base != "fp32"
                                else "")
        why = f"({option(asked)})" if asked else f"({device} does not run {_WORDS[ran]})"
        line = (f"scoring on {device} in {what} {why}; the run's own scores came from "
                f"{before}, and scores and replies may differ from them")
    if precision == "bf16" and device.type == "cpu" and not cpu_bf16_native():
        line += "; this CPU has no native bf16, so it is emulated and slow"
    return Scoring(device, precision, _DTYPES[base], as_run, line)


PRECISION_FILE = "precision.json"
"""In every export: the precision the run's own scores came from, and how to run in it."""


def precision_record(summary: Summary, fmt: str) -> dict[str, Any]:
    """``precision.json`` of an export in ``fmt``: ``autocast``, ``base_dtype`` and
    ``device`` of the run's own scores, and ``how``, a sentence on running the export so."""
    ran = summary.precision or {}
    record = _precision_words(ran, (summary.device or "cpu").split(":")[0], fmt)
    quant = ran.get("base_quant")
    if quant == "nf4":
        record["base_quant"] = quant
        record["how"] = f"{nf4_words(fmt, record['base_dtype'])} {record['how']}"
    return record


def nf4_words(fmt: str, base: str) -> str:
    """What a loader must do with a run that trained on a 4-bit NF4 base (model.quantize)."""
    if fmt == "merged":
        return ("The run trained on a 4-bit NF4 base (model.quantize=nf4): these merged "
                "weights are that base dequantized plus the adapter's update, saved in full "
                "precision; load them as they are (quantizing them to 4 bits again rounds "
                "the update too).")
    compute = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(base, "torch.float32")
    return ("The run trained on a 4-bit NF4 base (model.quantize=nf4): load the base model "
            "with its linear layers in NF4, 64-value blocks with double-quantized scales "
            "(transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
            "bnb_4bit_use_double_quant=True, "
            f"bnb_4bit_compute_dtype={compute}), or torchao's to_nf4), then apply this "
            "adapter; on a full-precision base it computes the run's model up to NF4's "
            "rounding, and scores can differ.")


def _precision_words(ran: dict[str, Any], device: str, fmt: str) -> dict[str, Any]:
    autocast, base = ran.get("autocast", "fp32"), ran.get("base_dtype", "fp32")
    if autocast not in ("bf16", "fp16"):
        how = ("The run's scores came from fp32: load and run the model in float32, as it "
               "is saved.")
        return {"autocast": autocast, "base_dtype": base, "device": device, "how": how}
    dtype = "torch.bfloat16" if autocast == "bf16" else "torch.float16"
    ran_words = (f"{_WORDS[autocast]} on {device} (base weights in {base}, adapter and head "
                 "in fp32)")
    if fmt != "merged" and base != "fp32":  # an adapter over the base the loader builds
        run_so = (f"load the base with dtype={dtype} and call the model under "
                  f"torch.autocast({device!r}, dtype={dtype})")
    else:  # a merged model is saved in fp32; an fp32 base stays fp32
        run_so = f"call the model under torch.autocast({device!r}, dtype={dtype})"
    how = (f"The run's scores came from {ran_words}: {run_so} to run in its precision. "
           "In float32 scores and greedy replies can differ from the run's; in its precision "
           "other kernels (PEFT's order of the adapter's operations) can still change the "
           "last digits.")
    return {"autocast": autocast, "base_dtype": base, "device": device, "how": how}
