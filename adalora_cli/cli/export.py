"""``adalora export``: a trained run as a PEFT adapter, a plain LoRA or a merged transformers
model."""

from __future__ import annotations

from pathlib import Path

import typer

from .boundary import boundary, note, out, quiet_libraries


def export(
    run_dir: Path = typer.Argument(..., help="A finished run directory"),
    out_dir: Path = typer.Argument(..., help="New folder to write (must not exist)"),
    fmt: str = typer.Option("peft", "--format", "-f",
                            help="peft (PeftModel.from_pretrained loads it), lora (a plain "
                                 "LoRA with each matrix's final rank, every scale folded in: "
                                 "vLLM and llama.cpp load it too) or merged (Delta W folded "
                                 "into the weights: a plain transformers model)"),
) -> None:
    """Export a trained run as a PEFT adapter, a plain LoRA or a merged transformers model.

    Examples:
      adalora export runs/rte-adalora-s0-... out/rte-peft
      adalora export runs/rte-adalora-s0-... out/rte-lora --format lora
      adalora export runs/rte-adalora-s0-... out/rte-merged --format merged

    Docs: docs/using-a-run.md"""
    from ..artifacts.export import export_run

    quiet_libraries()
    with boundary():
        info = export_run(run_dir, fmt, out_dir, note=note)
    console = out()
    if info["format"] == "lora":
        ranks = [r for r in info["ranks"].values() if r]
        left_out = len(info["ranks"]) - len(ranks)
        gone = f", {left_out} of rank 0 left out" if left_out else ""
        console.print(f"plain LoRA {info['task_type'] or ''} adapter: {info['adapter_params']:,} "
                      f"adapter params over {len(ranks)} matrices (ranks {min(ranks)} to "
                      f"{max(ranks)}{gone}), {info['head_params']:,} head params, "
                      f"{info['bytes']:,} bytes; r = lora_alpha = {info['r']}: serve it with "
                      f"--max-lora-rank {info['r']} or more", highlight=False, soft_wrap=True)
    elif info["format"] == "peft":
        kept = info["adapter_params"]
        at_r0 = info["adapter_params_at_r0"]
        of_r0 = f" (of {at_r0:,} at r0)" if kept != at_r0 else ""
        console.print(f"PEFT {info['task_type'] or ''} adapter: {kept:,} adapter params{of_r0}, "
                      f"{info['head_params']:,} head params, {info['bytes']:,} bytes",
                      highlight=False, soft_wrap=True)
        if info.get("peft_type") == "ADALORA":
            console.print("note: loading it, PEFT warns that its rank_pattern keys match no "
                          "module (as for its own AdaLoRA adapters; the ranks are applied): "
                          "docs/using-a-run.md says why and how to quiet it", highlight=False)
    else:
        console.print(f"merged {info['merged_matrices']} matrices into a "
                      f"{info['model_class']}: {info['bytes']:,} bytes", highlight=False,
                      soft_wrap=True)
    if info.get("labels") is not None:  # an adapter of a sequence classifier
        head = ", ".join(info["labels"]) or "a regressor's one output"
        console.print(f"base_config.json: the base's config with this run's head ({head}); "
                      "load the base with config=AutoConfig.from_pretrained of it "
                      "(docs/using-a-run.md)", highlight=False, soft_wrap=True)
    precision = info.get("precision") or {}
    if precision.get("autocast") in ("bf16", "fp16"):  # fp32 needs no saying
        console.print(f"precision.json: the run scored in {precision['autocast']} autocast "
                      f"(base weights in {precision['base_dtype']}); it says how to run the "
                      "export in that precision", highlight=False, soft_wrap=True)
    if "base_folder" in info:
        console.print(f"PEFT base (the GGUF file dequantized): {info['base_folder']}",
                      highlight=False, soft_wrap=True)
    elif info["format"] != "merged" and info.get("base"):
        console.print(f"PEFT base: {info['base']}", highlight=False, soft_wrap=True)
    console.print(f"wrote {out_dir} (README.md: what was trained, its scores, the base and "
                  "how to load it)", highlight=False, soft_wrap=True)
