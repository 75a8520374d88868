"""Tokens per second of causal-LM fine-tuning: our AdaLoRA and LoRA steps against Hugging
Face ``Trainer`` + PEFT's LoRA, on the LLM demo's model and chats.

The LLM demo (configs/demo/smollm2_bbc_topic.yaml: SmolLM2-135M-Instruct, 210 adapted
matrices, AdaLoRA r0 4 and LoRA r 2, batches of 4 chats) trains on one batch of its real
chats, the same batch every step for every arm, so each arm processes the same tokens:

- ``ours-adalora``, ``ours-lora``: the training loop's own step (step_time.make_stepper:
  forward, loss, backward, clipping, AdamW, the allocator's after-step);
- ``hf-peft-lora``: ``Trainer.train()`` on PEFT's LoRA of the same model (the same loaded
  weights and target matrices, r and alpha from the config), fed that batch as is; a round
  is timed from the end of its first step to the end of training, so Trainer's set-up
  (optimizer, data loader, accelerate) is left out as our set-up is.

Rounds alternate between the arms (8 by default) so machine noise lands on all; each prints
its median step and tokens per second (the batch's non-padding tokens over that step), then
the ratios. ``--tiny``: the causal-LM smoke config (a 2-layer random Llama), a CPU check.

    python benchmarks/llm_tokens.py --device cuda --precision bf16
    python benchmarks/llm_tokens.py --tiny --rounds 2 --steps 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from step_time import Setup, make_stepper

from adalora_cli.config import load_config
from adalora_cli.engine.build import load_model, resolve_resources
from adalora_cli.methods.inject import resolve_targets
from adalora_cli.tasks import get_task

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo" / "smollm2_bbc_topic.yaml"
TINY = ROOT / "configs" / "smoke" / "causal_lm.yaml"


def demo_batch(config: Path, size: int | None):
    """The config, its model's adapted matrices, and one collated batch of its first
    training chats (``size`` of them; the config's batch size by default)."""
    cfg = resolve_resources(load_config(config))
    task = get_task(cfg)
    model, tokenizer = load_model(task, cfg)
    data = task.load_data(tokenizer)
    size = size or cfg.train.batch_size
    batch = data.collate([data.train[i] for i in range(size)])
    return cfg, resolve_targets(model, cfg.method.target_modules), batch


def hf_lora_arm(cfg, targets: list[str], batch: dict, device: torch.device,
                precision: str, steps: int):
    """A function running one round of ``steps`` timed Trainer steps; returns seconds per
    step. PEFT's LoRA on our loader's copy of the model (the same weights: a GGUF file is
    dequantized as our runs load it)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    model = get_peft_model(model, LoraConfig(
        task_type="CAUSAL_LM", r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout, target_modules=targets))
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    marks: dict[str, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the first step warms up; time the others
                sync()
                marks["start"] = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            sync()
            marks["end"] = time.perf_counter()

    rows = [dict(batch) for _ in range(steps + 1)]  # one whole batch per Trainer "row"
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="llm-tokens-"), report_to="none",  # nothing saved
        per_device_train_batch_size=1, max_steps=steps + 1, learning_rate=1e-4,
        warmup_steps=0, max_grad_norm=1.0, save_strategy="no", eval_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=cuda, use_cpu=not cuda, bf16=precision == "bf16")
    trainer = Trainer(model=model, args=args, train_dataset=rows,
                      data_collator=lambda items: items[0], callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # its end-of-train dict between our lines

    def round_() -> float:
        trainer.train()
        return (marks["end"] - marks["start"]) / steps

    return round_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps per round per arm")
    parser.add_argument("--batch", type=int, default=None,
                        help="chats per batch (default: the config's, 4 for the demo)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--tiny", action="store_true",
                        help="the causal-LM smoke config's tiny model: a CPU check")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps take 1 or more")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = TINY if args.tiny else DEMO
    cfg, targets, batch = demo_batch(config, args.batch)
    tokens = int(batch["attention_mask"].sum())
    r0, r = cfg.adalora.init_rank, cfg.lora.r
    budget = cfg.adalora.final_budget(len(targets))
    setup = Setup(config, [], budget, None, "CAUSAL_LM")
    total = 2 + (args.rounds + 1) * args.steps + 10
    kw = {"setup": setup, "device": device, "precision": args.precision}
    ours = {"ours-adalora": make_stepper("adalora", r0, total, batch, **kw),
            "ours-lora": make_stepper("lora", r, total, batch, **kw)}
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(step):
        def round_() -> float:
            sync()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            return (time.perf_counter() - start) / args.steps
        return round_

    arms = {name: timed(step) for name, step in ours.items()}
    try:  # the bench extra; without it the Trainer line is left out, not faked
        arms["hf-peft-lora"] = hf_lora_arm(cfg, targets, batch, device, args.precision,
                                           args.steps)
    except ImportError:
        print("peft not installed (pip install -e '.[bench]'): HF Trainer + PEFT LoRA skipped")
    for step in ours.values():  # warm-up: allocations, autograd caches
        step()
        step()
    names = list(arms)
    times: dict[str, list[float]] = {m: [] for m in names}
    for i in range(args.rounds):
        for m in (names if i % 2 == 0 else names[::-1]):
            times[m].append(arms[m]())
    where = torch.cuda.get_device_name(device) if cuda else (
        f"cpu, {torch.get_num_threads()} threads")
    what = "causal-LM smoke model (tiny)" if args.tiny else "LLM demo (SmolLM2-135M-Instruct)"
    print(f"{what}, {len(targets)} matrices, AdaLoRA r0 {r0}, LoRA r {r}, batch "
          f"{tuple(batch['input_ids'].shape)} ({tokens} tokens), {args.rounds} rounds x "
          f"{args.steps} steps, {where}, {args.precision}")
    med = {m: statistics.median(v) for m, v in times.items()}
    for m in names:
        print(f"  {m:14s} median step {med[m] * 1000:9.1f} ms  {tokens / med[m]:10.0f} tokens/s")
    print(f"AdaLoRA / LoRA step-time ratio (ours): {med['ours-adalora'] / med['ours-lora']:.3f}")
    if "hf-peft-lora" in med:
        for m in ("ours-lora", "ours-adalora"):
            print(f"{m} / hf-peft-lora tokens per second: {med['hf-peft-lora'] / med[m]:.3f}")


if __name__ == "__main__":
    main()
