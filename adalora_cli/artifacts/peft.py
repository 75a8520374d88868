"""``--format peft``: a folder that ``peft.PeftModel.from_pretrained(base, folder)`` loads.

Written with safetensors and json only; PEFT is never imported here (it is a test-time
dependency). The mapping onto PEFT's names and conventions:

- LoRA: our ``A (r, d_in)`` / ``B (d_out, r)`` are PEFT's ``lora_A.weight`` / ``lora_B.weight``;
  both scale by ``alpha / r``, so the tensors go over unchanged. rsLoRA sets ``use_rslora``,
  DoRA ``use_dora`` with its magnitudes, LoRA+ is plain LoRA once trained, and PiSSA is
  written on the original W0 as a rank-2r LoRA (see the writers below).
- AdaLoRA: our ``Q (r0, d_in)``, ``lam (r0,)``, ``P (d_out, r0)`` are PEFT's ``lora_A``,
  ``lora_E (r, 1)`` and ``lora_B``. PEFT scales by ``lora_alpha / (ranknum + 1e-5)`` with
  ``ranknum = init_r`` (kept when the rank pattern shrinks a layer), where we use
  ``alpha / r0`` exactly (docs/maths.md#svd-adaptation); ``lam`` is multiplied by
  ``(r0 + 1e-5) / r0`` so that the product is ours.
- The export is compact, as PEFT itself saves a trained AdaLoRA adapter: ``rank_pattern``
  holds one keep-flag per initial triplet and the tensors hold only the kept triplets, so
  the file has the paper's "# Params" (plus the head) rather than the r0 count.
- GPT-2's ``Conv1D`` stores its weight as ``(d_in, d_out)``; our factors and PEFT's keep the
  ``nn.Linear`` orientation for it too, so only ``fan_in_fan_out`` is set (see
  :func:`fan_in_fan_out`).
- The task head travels as PEFT's ``modules_to_save``; the task type tells PEFT which
  wrapper to build (none for QA models that use segment ids, see :func:`peft_task_type`).
- A local base model is recorded by its absolute path, so the adapter loads from any
  working directory.
- A sequence classifier's head is the run's own (its number of labels, their names, or a
  regressor's one output), which the base checkpoint's ``config.json`` does not say:
  ``base_config.json`` is the base's config with that head, for
  ``AutoConfig.from_pretrained`` to hand to the base's ``from_pretrained``
  (docs/using-a-run.md). Not ``config.json``: transformers would then take the folder for
  a whole model with an embedded adapter and look for the base weights in it.

A method without a PEFT type is refused before the run's model is loaded; each kind of
adapted layer has its writer in :data:`WRITERS`, and a layer without one is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..config import ConfigError, RunConfig
from ..engine.outputs import head_modules
from ..methods.adalora import SVDLinear
from ..methods.base import adapter_modules
from ..methods.dora import DoRALinear
from ..methods.eva import EVALinear
from ..methods.gora import GoRALinear
from ..methods.lora import LoRALinear
from ..methods.pissa import PiSSALinear
from ..methods.registry import METHODS
from ..rundir.layout import ALLOCATOR_STATE
from ..rundir.no_code import load_tensors
from ..rundir.summary import Summary
from ..tasks.pretrained import load_config

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
BASE_CONFIG_FILE = "base_config.json"
"""A sequence classifier's base config with the run's head: labels, names, problem type."""
PREFIX = "base_model.model."
PEFT_EPS = 1e-5
"""PEFT's AdaLoRA divides by ``ranknum + 1e-5``; the export compensates for it."""

_TASK_TYPES = (("ForSequenceClassification", "SEQ_CLS"), ("ForQuestionAnswering", "QUESTION_ANS"),
               ("ForTokenClassification", "TOKEN_CLS"), ("ForConditionalGeneration",
                                                         "SEQ_2_SEQ_LM"),
               ("ForSeq2SeqLM", "SEQ_2_SEQ_LM"), ("ForCausalLM", "CAUSAL_LM"),
               ("LMHeadModel", "CAUSAL_LM"))  # GPT2LMHeadModel


def check_peft_method(method: str | None) -> None:
    """A method without a PEFT type (the registry's ``peft_type``) is refused in one line,
    before the run's model is loaded."""
    spec = METHODS.get(method or "")
    if spec is not None and spec.peft_type is not None:
        return
    fix = ("use --format merged" if spec is not None and spec.mergeable else
           "use the run's adapter_model.safetensors with adalora_cli.artifacts.load.load_run")
    names = " and ".join(n for n, s in METHODS.items() if s.peft_type)
    raise ConfigError(f"PEFT has no format for method {method!r} (only {names} "
                      f"export to PEFT); {fix}")


def peft_task_type(model: nn.Module) -> str | None:
    name = type(model).__name__
    kind = next((kind for suffix, kind in _TASK_TYPES if name.endswith(suffix)), None)
    if kind == "QUESTION_ANS" and getattr(model.config, "type_vocab_size", 0) > 1:
        # PEFT's question-answering wrapper (0.21) does not pass token_type_ids on, which
        # changes every BERT-style answer; the plain PeftModel passes all inputs through.
        return None
    return kind


def kept_triplets(run_dir: Path, layers: list[tuple[str, SVDLinear]]) -> dict[str, torch.Tensor]:
    """``{path: bool mask (r0,)}`` of the triplets the allocator kept (all of them if the run
    did not prune)."""
    state_path = run_dir / ALLOCATOR_STATE
    if not state_path.is_file():
        return {path: torch.ones(layer.r0, dtype=torch.bool) for path, layer in layers}
    state = load_tensors(state_path)
    if list(state["paths"]) != [path for path, _ in layers]:
        raise ConfigError(f"{state_path} was saved for other adapted matrices than the "
                          "run's config builds; the run directory is inconsistent")
    flat, out, off = state["mask"].bool(), {}, 0
    for path, layer in layers:
        out[path] = flat[off:off + layer.r0]
        off += layer.r0
    return out


def adalora_tensors(layers: list[tuple[str, SVDLinear]], keep: dict[str, torch.Tensor]):
    """PEFT tensors and ``rank_pattern`` of the kept triplets, and of any masked one whose
    singular value is not zero: between two mask events a masked ``lam`` keeps training
    (docs/maths.md#masking), so a step chosen there (``train.select=best``) holds some, and
    the export must compute what the run computed. At the end of a run the final phase has
    zeroed them all."""
    tensors: dict[str, torch.Tensor] = {}
    pattern: dict[str, list[bool]] = {}
    for path, layer in layers:
        k = keep[path] | (layer.lam.detach() != 0)  # (r0,) bool
        fix = (layer.r0 + PEFT_EPS) / layer.r0  # PEFT's ranknum + eps -> our r0
        tensors[f"{PREFIX}{path}.lora_A"] = layer.Q.detach()[k]  # (r, d_in)
        tensors[f"{PREFIX}{path}.lora_E"] = (layer.lam.detach()[k] * fix).unsqueeze(1)  # (r, 1)
        tensors[f"{PREFIX}{path}.lora_B"] = layer.P.detach()[:, k]  # (d_out, r)
        pattern[f"{path}.lora_E"] = k.tolist()
    return tensors, pattern


def lora_tensors(layers: list[tuple[str, LoRALinear]]) -> dict[str, torch.Tensor]:
    tensors = {}
    for path, layer in layers:
        tensors[f"{PREFIX}{path}.lora_A.weight"] = layer.A.detach()  # (r, d_in)
        tensors[f"{PREFIX}{path}.lora_B.weight"] = layer.B.detach()  # (d_out, r)
    return tensors


def head_tensors(model: nn.Module, heads: list[str]) -> dict[str, torch.Tensor]:
    return {PREFIX + name: p.detach() for name, p in model.named_parameters()
            if name.split(".", 1)[0] in heads}


def fan_in_fan_out(layers: list[tuple[str, nn.Module]]) -> bool:
    """PEFT's flag for GPT-2's ``Conv1D`` (weight stored ``(d_in, d_out)``). Our factors keep
    ``nn.Linear``'s orientation for both layouts, as PEFT's ``lora_A`` / ``lora_B`` do, so
    the tensors go over unchanged; PEFT reads the flag to merge into the right layout (and
    corrects it per layer, with a warning, in a model that mixes both layouts)."""
    return any(layer.fan_in_fan_out for _, layer in layers)


def base_path(name: str) -> str:
    """A local base model as an absolute path (PEFT resolves a relative one against the
    loader's working directory); a hub id as it is."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def base_config(cfg: RunConfig, model: nn.Module, summary: Summary, heads: list[str],
                targets: list[str], transposed: bool = False,
                base: tuple[str, str | None] | None = None) -> dict[str, Any]:
    """``adapter_config.json``'s common entries; ``base``: the base's name and revision when
    it is not the run's model path (a GGUF file from a hub repo is named by the repo)."""
    name, revision = base or (base_path(cfg.model.name_or_path), summary.export.revision)
    return {
        "base_model_name_or_path": name,
        "revision": revision,
        "task_type": peft_task_type(model),
        "inference_mode": True,
        "target_modules": targets,  # full module paths: PEFT matches them exactly
        "modules_to_save": heads or None,
        "bias": "none",
        "fan_in_fan_out": transposed,
        "init_lora_weights": True,
    }


def adalora_config(cfg: RunConfig, summary: Summary, n: int,
                   pattern: dict[str, list[bool]]) -> dict[str, Any]:
    a = cfg.adalora
    return {
        "peft_type": "ADALORA", "init_r": a.init_rank, "target_r": max(1, round(a.budget / n)),
        "lora_alpha": a.alpha, "lora_dropout": a.dropout, "rank_pattern": pattern,
        "tinit": a.t_init, "tfinal": a.t_final, "deltaT": a.delta_t, "beta1": a.beta1,
        "beta2": a.beta2, "orth_reg_weight": a.gamma,
        "total_step": summary.total_steps or a.t_init + a.t_final + 1,
    }


def check_base_rebuilds(cfg: RunConfig, model: nn.Module) -> None:
    """PEFT rebuilds the base with ``from_pretrained(base_model_name_or_path)``; a model the
    task built from another kind of checkpoint (the warm-started summarization demo) has no
    such base."""
    kind = getattr(model.config, "model_type", None)
    base_kind = load_config(cfg.model.name_or_path).model_type
    if kind != base_kind:
        raise ConfigError(f"the run's {kind} model was built from the {base_kind} checkpoint "
                          f"{cfg.model.name_or_path}, which PEFT cannot load as its base; "
                          "use --format merged")


Layers = list[tuple[str, nn.Module]]
Tensors = dict[str, torch.Tensor]
Writer = Callable[[Path, RunConfig, Summary, Layers], tuple[Tensors, dict[str, Any]]]
"""``(run_dir, cfg, summary, layers) -> (PEFT tensors of the adapter, adapter_config.json
entries)``: how one kind of adapted layer goes over to PEFT."""


def _adalora_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                    layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    tensors, pattern = adalora_tensors(layers, kept_triplets(run_dir, layers))
    return tensors, adalora_config(cfg, summary, len(layers), pattern)


def _lora_entries(layers: Layers, rank_factor: int = 1) -> dict[str, Any]:
    """LoRA's ``adapter_config.json`` entries from the layers themselves (LoRA, rsLoRA,
    LoRA+, DoRA and PiSSA share them; one run's layers share r and alpha). A rank
    ``rank_factor`` times the layer's keeps its scaling with ``lora_alpha`` scaled alike."""
    first = layers[0][1]
    return {"peft_type": "LORA", "r": first.r * rank_factor,
            "lora_alpha": first.alpha * rank_factor, "lora_dropout": first.dropout_p,
            "use_rslora": first.rslora}


def _lora_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                 layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    """LoRA, rsLoRA (``use_rslora``: PEFT scales by alpha / sqrt(r) as we do) and LoRA+
    (whose learning rates leave no trace in the weights); LoRA on a finished AdaLoRA run's
    ranks with ``rank_pattern`` (:func:`_rank_entries`)."""
    return lora_tensors(layers), {**_lora_entries(layers), **_rank_entries(layers)}


def _rank_entries(layers: Layers) -> dict[str, Any]:
    """Layers of several ranks (``lora.rank_pattern``): each module's rank in PEFT's
    ``rank_pattern``, which PEFT scales by ``lora_alpha / r_m`` as our layer does; ``r`` the
    largest. PEFT takes the first pattern key that ends a module's path, so the longest
    paths come first (x.y never stands in for w.x.y). One rank everywhere: no entries."""
    ranks = {path: layer.r for path, layer in layers}
    if len(set(ranks.values())) == 1:
        return {}
    order = sorted(ranks, key=len, reverse=True)
    return {"r": max(ranks.values()), "rank_pattern": {path: ranks[path] for path in order}}


def _dora_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                 layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    """DoRA: PEFT's ``lora_magnitude_vector`` is our ``m`` (one entry per output feature);
    PEFT's forward detaches ``||W0 + s B A||`` as ours does."""
    tensors = lora_tensors(layers)
    for path, layer in layers:
        tensors[f"{PREFIX}{path}.lora_magnitude_vector"] = layer.m.detach()  # (d_out,)
    return tensors, {**_lora_entries(layers), "use_dora": True}


def _pissa_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                  layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    """PiSSA on the original W0 (docs/maths.md#pissa): the update ``s (B A - B0 A0)`` is the
    rank-2r LoRA ``[B, -B0] [A; A0]``; ``lora_alpha`` doubles with ``r`` to keep ``s``."""
    tensors = {}
    for path, layer in layers:
        tensors[f"{PREFIX}{path}.lora_A.weight"] = torch.cat(
            [layer.A.detach(), layer.A0.detach()], dim=0)  # (2r, d_in)
        tensors[f"{PREFIX}{path}.lora_B.weight"] = torch.cat(
            [layer.B.detach(), -layer.B0.detach()], dim=1)  # (d_out, 2r)
    return tensors, _lora_entries(layers, rank_factor=2)


def _gora_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                 layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    """GoRA (docs/maths.md#gora): LoRA at several ranks, every module scaled by
    ``alpha / r`` with the mean rank r. PEFT scales module m by ``alpha_m / r_m`` from its
    ``alpha_pattern`` and ``rank_pattern``, so ``alpha_m = s r_m``; the longest paths first,
    as :func:`_rank_entries` orders them."""
    s = layers[0][1].scaling  # one s in every module of a GoRA run
    ranks = {path: layer.r for path, layer in layers}
    order = sorted(ranks, key=len, reverse=True)
    r = max(ranks.values())
    return lora_tensors(layers), {
        **_lora_entries(layers), "r": r, "lora_alpha": s * r,
        "rank_pattern": {path: ranks[path] for path in order},
        "alpha_pattern": {path: s * ranks[path] for path in order}}


def _eva_writer(run_dir: Path, cfg: RunConfig, summary: Summary,
                layers: Layers) -> tuple[Tensors, dict[str, Any]]:
    """EVA (docs/maths.md#eva): LoRA at the ranks its pass chose, module m scaled by its own
    ``s_m`` (alpha / r everywhere with eva.adjust_scaling_factors, else alpha / r_m); PEFT
    scales by ``alpha_m / r_m``, so ``alpha_m = s_m r_m``. A module given rank 0 trained
    nothing and PEFT takes no rank 0: it is left out of ``target_modules``, as PEFT's own
    EVA removes it. The longest paths first, as :func:`_rank_entries` orders them."""
    kept = [(path, layer) for path, layer in layers if layer.r > 0]
    order = sorted((path for path, _ in kept), key=len, reverse=True)
    ranks = {path: layer.r for path, layer in kept}
    alphas = {path: layer.scaling * layer.r for path, layer in kept}
    r = max(ranks.values())
    return lora_tensors(kept), {
        **_lora_entries(kept), "r": r, "lora_alpha": alphas[order[0]] * r / ranks[order[0]],
        "target_modules": [path for path, _ in kept],
        "rank_pattern": {path: ranks[path] for path in order},
        "alpha_pattern": {path: alphas[path] for path in order}}


WRITERS: dict[type[nn.Module], Writer] = {SVDLinear: _adalora_writer, LoRALinear: _lora_writer,
                                          DoRALinear: _dora_writer, PiSSALinear: _pissa_writer,
                                          GoRALinear: _gora_writer, EVALinear: _eva_writer}
"""Adapted-layer type -> its PEFT writer (the exact type: a DoRA layer is not written as
LoRA). A run whose layers have no entry is refused, never written as something else."""


def pick_writer(layers: Layers) -> Writer:
    """The writer of the run's one layer type; a one-line ConfigError otherwise."""
    kinds = {type(m) for _, m in layers}
    if len(kinds) != 1 or next(iter(kinds)) not in WRITERS:
        names = ", ".join(sorted(k.__name__ for k in kinds)) or "no adapted layer"
        raise ConfigError(f"the run's adapted layers ({names}) have no PEFT format; use "
                          "--format merged")
    return WRITERS[next(iter(kinds))]


def write_peft(run_dir: Path, model: nn.Module, tokenizer: Any, cfg: RunConfig,
               summary: Summary, out: Path,
               base: tuple[str, str | None] | None = None) -> dict[str, Any]:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` into ``out``, and a
    sequence classifier's ``base_config.json``; ``labels`` in the answer: its class names
    (empty for a regressor), None for other models. ``base``: the base's name and revision
    to record, when not the run's own model path."""
    check_peft_method(cfg.method.name)
    check_base_rebuilds(cfg, model)
    layers = adapter_modules(model)
    writer = pick_writer(layers)
    heads = head_modules(model)
    targets = [path for path, _ in layers]
    config = base_config(cfg, model, summary, heads, targets, fan_in_fan_out(layers), base)
    tensors, entries = writer(run_dir, cfg, summary, layers)
    config.update(entries)
    return save_adapter(out, model, layers, config, tensors, heads)


def save_adapter(out: Path, model: nn.Module, layers: Layers, config: dict[str, Any],
                 tensors: Tensors, heads: list[str]) -> dict[str, Any]:
    """Write the adapter's ``tensors`` with the run's head, ``config`` as
    ``adapter_config.json`` and a sequence classifier's ``base_config.json`` into ``out``;
    returns what was written (``layers``: the run's adapted layers, for the count at r0)."""
    r0_params = sum(p.numel() for _, m in layers for p in m.adapter_parameters())
    adapter_params = sum(t.numel() for t in tensors.values())
    tensors = {**tensors, **head_tensors(model, heads)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_FILE),
              metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    labels = write_base_config(model, out) if config["task_type"] == "SEQ_CLS" else None
    return {"adapter_params": adapter_params, "adapter_params_at_r0": r0_params,
            "head_params": sum(t.numel() for k, t in tensors.items()
                               if k.removeprefix(PREFIX).split(".", 1)[0] in heads),
            "bytes": (out / WEIGHTS_FILE).stat().st_size, "task_type": config["task_type"],
            "peft_type": config["peft_type"], "labels": labels,
            "base": config["base_model_name_or_path"]}


def write_base_config(model: nn.Module, out: Path) -> list[str]:
    """``base_config.json``: the base's config with the run's head (``num_labels``,
    ``id2label``/``label2id``, ``problem_type``), saved as ``save_pretrained`` would save it;
    returns the class names in id order (none for a regressor)."""
    import copy

    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.to_json_file(out / BASE_CONFIG_FILE)
    if config.problem_type == "regression":
        return []
    return [config.id2label[i] for i in range(config.num_labels)]
