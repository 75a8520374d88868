"""AdaLoRA / LoRA training-step time on the demo model, measured side by side.

Both methods adapt the same 36 matrices of the pretrained MiniLM with the same rank
(AdaLoRA r0 = LoRA r), train on the same batch of real review snippets, and run the
whole optimizer step the loop runs: forward, loss (+ the orthogonal regularizer for
AdaLoRA), backward, clipping, AdamW, and AdaLoRA's after-step (importance EMAs every
step, a mask every delta_t). Rounds alternate between the two so machine noise lands on
both; the ratio of medians is printed. Target: at most 1.03. With the ``bench`` extra
installed, PEFT's AdaLoRA on the same model and schedule is timed alongside (its
``update_and_allocate`` after each optimizer step, as PEFT documents). A fourth line runs
our AdaLoRA step on the same batch cut into ``--split`` length-sorted pieces, as
``train.length_split`` does (engine/split.py), against the whole batch.

    python benchmarks/step_time.py [--rank 4] [--rounds 12] [--steps 5] [--batch 32] [--split 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from adalora_cli.config import load_config
from adalora_cli.engine.build import load_model, resolve_resources
from adalora_cli.engine.split import LengthSplit
from adalora_cli.engine.step import Stepper
from adalora_cli.methods import apply_method
from adalora_cli.tasks import get_task

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo" / "rotten_tomatoes.yaml"


def make_stepper(method: str, rank: int, total: int, batch: dict | list,
                 ddp: bool = False):
    """``batch``: one collated batch, or a list of (piece, share) as LengthSplit returns."""
    cfg = resolve_resources(load_config(DEMO, [
        f"method.name={method}", f"adalora.init_rank={rank}", f"lora.r={rank}",
        f"adalora.budget={rank * 18}", "adalora.t_init=0",
        "adalora.delta_t=10", "adalora.t_final=1", "train.learning_rate=1e-4",
        "train.warmup_steps=0", "train.grad_accum=1", "train.max_grad_norm=1.0",
        "train.precision=fp32"]))
    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    handle = apply_method(model, cfg, total)
    model.train()
    if ddp:  # benchmarks/ddp_step.py: the loop's distributed path
        model = torch.nn.parallel.DistributedDataParallel(model)
    # the training loop's own step, built as the loop builds it: forward+backward, clip,
    # AdamW, lr step, after-step
    stepper = Stepper.build(model, handle, cfg.train, total, torch.device("cpu"))
    state = {"t": 0}
    pieces = batch if isinstance(batch, list) else [(batch, 1.0)]

    def step() -> None:
        stepper.backward_pieces(pieces)  # the loop's own call
        state["t"] += 1
        stepper.update(state["t"])

    return step


def make_peft_stepper(rank: int, total: int, batch: dict):
    """PEFT's AdaLoRA on the same model, matrices, rank and schedule, stepped the way its
    documentation shows: the loss (with its orthogonal penalty) forward and backward,
    clip, AdamW, ``update_and_allocate(step)`` before ``zero_grad``."""
    from peft import AdaLoraConfig, get_peft_model

    from adalora_cli.methods.inject import resolve_targets

    cfg = resolve_resources(load_config(DEMO))
    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    targets = resolve_targets(model, cfg.method.target_modules)
    model = get_peft_model(model, AdaLoraConfig(
        task_type="SEQ_CLS", init_r=rank, target_r=max(1, rank // 2), tinit=0, tfinal=1,
        deltaT=10, beta1=cfg.adalora.beta1, beta2=cfg.adalora.beta2,
        orth_reg_weight=cfg.adalora.gamma, lora_alpha=cfg.adalora.alpha,
        lora_dropout=cfg.adalora.dropout, total_step=total, target_modules=targets))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    state = {"t": 0}

    def step() -> None:
        model(**batch).loss.backward()  # PEFT adds the orthogonal penalty to .loss
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        model.base_model.update_and_allocate(state["t"])
        state["t"] += 1
        opt.zero_grad(set_to_none=True)

    return step


def real_items(size: int) -> tuple[list[dict], object]:
    """The demo's first ``size`` training examples and the task's collate function."""
    cfg = resolve_resources(load_config(DEMO))
    task = get_task(cfg)
    _, tokenizer = load_model(task, cfg)
    data = task.load_data(tokenizer)
    return [data.train[i] for i in range(size)], data.collate


def real_batch(size: int) -> dict:
    items, collate = real_items(size)
    return collate(items)


def padding(pieces: list) -> float:
    """Share of padded positions among the tokens the pieces carry."""
    masks = [b["attention_mask"] for b, _ in pieces]
    return 1 - sum(float(m.sum()) for m in masks) / sum(m.numel() for m in masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5, help="steps per round per method")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--split", type=int, default=4,
                        help="pieces for the length_split line; 1 leaves it out")
    args = parser.parse_args()
    import transformers
    transformers.utils.logging.set_verbosity_error()  # no load reports between the numbers
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    items, collate = real_items(args.batch)
    batch = collate(items)
    total = 2 + args.rounds * args.steps + 10
    steppers = {m: make_stepper(m, args.rank, total, batch) for m in ("adalora", "lora")}
    try:  # the bench extra; without it the PEFT line is left out, not faked
        steppers["peft-adalora"] = make_peft_stepper(args.rank, total, batch)
    except ImportError:
        print("peft not installed (pip install -e '.[bench]'): PEFT's AdaLoRA step skipped")
    med = alternate(steppers, list(steppers), args.rounds, args.steps)
    print(f"demo model (MiniLM-L6, 36 matrices), rank {args.rank}, batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps, {torch.get_num_threads()} threads")
    for m in ("lora", "adalora", "peft-adalora"):
        if m in med:
            print(f"  {m:12s} median step {med[m] * 1000:8.1f} ms")
    ratio = med["adalora"] / med["lora"]
    print(f"AdaLoRA / LoRA step-time ratio: {ratio:.3f}  (target <= 1.03)")
    if "peft-adalora" in med:
        print(f"our AdaLoRA / PEFT's AdaLoRA step-time ratio: "
              f"{med['adalora'] / med['peft-adalora']:.3f}")
    if args.split > 1:
        # its own alternating rounds against the whole batch: interleaving the narrow
        # pieces with the three steps above would bill their buffer regrowth to a neighbour
        pieces = LengthSplit(collate, args.split)(items)
        steppers["adalora-split"] = make_stepper("adalora", args.rank, total, pieces)
        med = alternate(steppers, ["adalora", "adalora-split"], args.rounds, args.steps)
        print(f"same AdaLoRA step, the batch whole vs in {args.split} length-sorted pieces "
              f"(train.length_split; padding {100 * padding([(batch, 1.0)]):.1f} % -> "
              f"{100 * padding(pieces):.1f} %): {med['adalora'] * 1000:.1f} ms vs "
              f"{med['adalora-split'] * 1000:.1f} ms")
        print(f"length_split={args.split} / whole-batch step-time ratio: "
              f"{med['adalora-split'] / med['adalora']:.3f}")


def alternate(steppers: dict, names: list[str], rounds: int, steps: int) -> dict[str, float]:
    """Median seconds per step of each named stepper, rounds alternating their order."""
    for m in names:  # warm-up: allocator buffers, autograd graph caches
        steppers[m]()
        steppers[m]()
    times: dict[str, list[float]] = {m: [] for m in names}
    for r in range(rounds):
        for m in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            for _ in range(steps):
                steppers[m]()
            times[m].append((time.perf_counter() - start) / steps)
    return {m: statistics.median(v) for m, v in times.items()}

if __name__ == "__main__":
    main()
