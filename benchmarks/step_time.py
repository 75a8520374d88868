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

On a GPU (``--device cuda``, ``--precision bf16``) and at the paper's shapes
(``--shape deberta-v3-base``: 32 x 128 classification; ``bart-large``: 8 x 512 sources, 64
target tokens), random-weight folders built by benchmarks/paper_shapes.py (``--tiny``:
narrow ones and small batches, a CPU check). On CUDA rounds are timed between
``torch.cuda.synchronize()`` calls, and the host syncs of a step without a mask event are
counted (``torch.cuda.set_sync_debug_mode("warn")``).

    python benchmarks/step_time.py --device cuda --precision bf16 --shape deberta-v3-base
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from adalora_cli.config import load_config
from adalora_cli.engine.build import load_model, resolve_resources
from adalora_cli.engine.precision import decide
from adalora_cli.engine.split import LengthSplit
from adalora_cli.engine.step import Stepper
from adalora_cli.methods import apply_method
from adalora_cli.tasks import get_task

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo" / "rotten_tomatoes.yaml"
CPU = torch.device("cpu")


@dataclass
class Setup:
    """Which config and model a stepper is built from, and the budget for its rank."""

    config: Path
    overrides: list[str]
    budget: int
    target_r: int | None = None  # PEFT's mean final rank; None: budget / matrices
    task_type: str = "SEQ_CLS"


def demo_setup(rank: int) -> Setup:
    return Setup(DEMO, [], rank * 18, max(1, rank // 2))


def make_stepper(method: str, rank: int, total: int, batch: dict | list,
                 ddp: bool = False, setup: Setup | None = None,
                 device: torch.device = CPU, precision: str = "fp32", tweak=None):
    """``batch``: one collated batch, or a list of (piece, share) as LengthSplit returns;
    on the CPU, moved to ``device`` at each step as the loop moves its batches (from pinned
    memory on CUDA, as the loop's DataLoader pins them). ``tweak(model, handle)``, if
    given, may change the method before the step is built (step_profile.py's variants)."""
    setup = setup or demo_setup(rank)
    cfg = resolve_resources(load_config(setup.config, [
        *setup.overrides,
        f"method.name={method}", f"adalora.init_rank={rank}", f"lora.r={rank}",
        f"adalora.budget={setup.budget}", "adalora.t_init=0",
        "adalora.delta_t=10", "adalora.t_final=1", "train.learning_rate=1e-4",
        "train.warmup_steps=0", "train.grad_accum=1", "train.max_grad_norm=1.0",
        f"train.precision={precision}"]))
    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    handle = apply_method(model, cfg, total)
    if tweak is not None:
        tweak(model, handle)
    model.to(device)  # after the method, as the loop does
    model.train()
    if ddp:  # benchmarks/ddp_step.py: the loop's distributed path
        model = torch.nn.parallel.DistributedDataParallel(model)
    # the training loop's own step, built as the loop builds it: forward+backward, clip,
    # AdamW, lr step, after-step
    stepper = Stepper.build(model, handle, cfg.train, total, decide(cfg, device))
    state = {"t": 0}
    pieces = batch if isinstance(batch, list) else [(batch, 1.0)]
    move = None if device.type == "cpu" else device
    if move is not None:
        pieces = [({k: v.pin_memory() for k, v in b.items()}, share) for b, share in pieces]

    def step() -> None:
        stepper.backward_pieces(pieces, device=move)  # the loop's own call
        state["t"] += 1
        stepper.update(state["t"])

    step.state = state  # host_syncs picks steps without a mask event by it
    return step


def make_peft_stepper(rank: int, total: int, batch: dict, setup: Setup | None = None,
                      device: torch.device = CPU, precision: str = "fp32"):
    """PEFT's AdaLoRA on the same model, matrices, rank and schedule, stepped the way its
    documentation shows: the loss (with its orthogonal penalty) forward and backward,
    clip, AdamW, ``update_and_allocate(step)`` before ``zero_grad``."""
    from peft import AdaLoraConfig, get_peft_model

    from adalora_cli.methods.inject import resolve_targets

    setup = setup or demo_setup(rank)
    cfg = resolve_resources(load_config(setup.config, setup.overrides))
    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    targets = resolve_targets(model, cfg.method.target_modules)
    target_r = setup.target_r or max(1, round(setup.budget / len(targets)))
    model = get_peft_model(model, AdaLoraConfig(
        task_type=setup.task_type, init_r=rank, target_r=target_r, tinit=0, tfinal=1,
        deltaT=10, beta1=cfg.adalora.beta1, beta2=cfg.adalora.beta2,
        orth_reg_weight=cfg.adalora.gamma, lora_alpha=cfg.adalora.alpha,
        lora_dropout=cfg.adalora.dropout, total_step=total, target_modules=targets))
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    state = {"t": 0}
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
           else contextlib.nullcontext())
    if device.type == "cuda":  # pinned, as HF Trainer's DataLoader pins its batches
        batch = {k: v.pin_memory() for k, v in batch.items()}

    def step() -> None:
        # moved at each step, as our stepper's batches are (a no-op on the CPU)
        on_device = {k: v.to(device) for k, v in batch.items()}
        with amp:
            loss = model(**on_device).loss  # PEFT adds the orthogonal penalty to .loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        model.base_model.update_and_allocate(state["t"])
        state["t"] += 1
        opt.zero_grad(set_to_none=True)

    return step


def shape_setup(shape: str, rank: int | None, tiny: bool, folder: Path) -> tuple[Setup, int]:
    """A random-weight folder of the paper's model (paper_shapes.py's builders) and the
    paper config's budget per unit of initial rank; returns the setup and the rank."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import paper_shapes

    if shape == "deberta-v3-base":
        path = paper_shapes.build_deberta(folder / f"deberta-v3-base{'-tiny' * tiny}", tiny)
        config, task_type = ROOT / "configs" / "glue" / "mnli.yaml", "SEQ_CLS"
    else:
        path = paper_shapes.build_bart(folder / f"bart-large{'-tiny' * tiny}", tiny)
        config, task_type = ROOT / "configs" / "summarization" / "xsum.yaml", "SEQ_2_SEQ_LM"
    paper = load_config(config).adalora  # b(T) / r0: 144 / 4 (MNLI), 1536 / 12 (XSum)
    rank = rank or paper.init_rank
    budget = round(paper.budget * rank / paper.init_rank)
    return Setup(config, [f"model.name_or_path={path}"], budget, None, task_type), rank


def synthetic_batch(shape: str, tiny: bool, size: int | None, vocab: int) -> tuple[dict, str]:
    """Random token ids at the paper's shape: DeBERTa 32 x 128 with 3-way labels, BART 8 x
    512 sources and 64 target tokens (tiny: 8 x 64; 4 x 64 and 16)."""
    g = torch.Generator().manual_seed(0)
    if shape == "deberta-v3-base":
        b, n = (size or 8, 64) if tiny else (size or 32, 128)
        ids = torch.randint(5, vocab, (b, n), generator=g)
        return ({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                 "labels": torch.randint(0, 3, (b,), generator=g)}, f"{b} x {n}")
    b, n, m = (size or 4, 64, 16) if tiny else (size or 8, 512, 64)
    ids = torch.randint(5, vocab, (b, n), generator=g)
    return ({"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "labels": torch.randint(5, vocab, (b, m), generator=g)},
            f"{b} x {n} source, {m} target")


def paper_shape(shape: str, rank: int | None, tiny: bool, size: int | None,
                models: Path | None) -> tuple[Setup, int, dict, str]:
    """``--shape``'s setup and rank (shape_setup, in ``models`` or a temp dir) and its
    synthetic batch with the batch's description."""
    import transformers

    folder = models or Path(tempfile.mkdtemp(prefix="step-time-"))
    setup, rank = shape_setup(shape, rank, tiny, folder)
    vocab = transformers.AutoConfig.from_pretrained(
        setup.overrides[0].split("=", 1)[1]).vocab_size
    batch, described = synthetic_batch(shape, tiny, size, vocab)
    return setup, rank, batch, described


def host_syncs(step, steps: int = 3) -> float:
    """Host syncs per step of a CUDA stepper, counted by the sync debug mode's warnings over
    ``steps`` steps with no mask event (delta_t 10: masks at t % 10 == 0)."""
    state = step.state
    while state["t"] % 10 != 3:  # also warms up: the first steps allocate and tune
        step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each sync, not once per call site
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the final synchronize() above is ours and is not reported (explicit syncs aren't);
    # nor is one the first switch to "warn" reports from inside set_sync_debug_mode
    return sum("synchroniz" in str(w.message) and not w.filename.endswith(
        str(Path("torch", "cuda", "__init__.py"))) for w in caught) / steps


def real_items(size: int, overrides: list[str] = ()) -> tuple[list[dict], object]:
    """The demo's first ``size`` training examples and the task's collate function
    (``overrides``: the demo config's, e.g. another folder of the same model)."""
    cfg = resolve_resources(load_config(DEMO, list(overrides)))
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
    parser.add_argument("--rank", type=int, default=None,
                        help="AdaLoRA r0 = LoRA r (default 4; the paper config's r0 for "
                             "--shape)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5, help="steps per round per method")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size (default 32; the shape's for --shape)")
    parser.add_argument("--split", type=int, default=4,
                        help="pieces for the length_split line; 1 leaves it out")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="train.precision: bf16 autocast (base weights stay fp32)")
    parser.add_argument("--shape", choices=["demo", "deberta-v3-base", "bart-large"],
                        default="demo")
    parser.add_argument("--tiny", action="store_true",
                        help="--shape at narrow widths and small batches (a CPU check)")
    parser.add_argument("--models", type=Path, default=None,
                        help="where --shape builds its model folder (default: a temp dir)")
    args = parser.parse_args()
    import transformers
    transformers.utils.logging.set_verbosity_error()  # no load reports between the numbers
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    # the new options off: the demo run and its printout exactly as before
    default = (args.device, args.precision, args.shape, args.tiny) == ("cpu", "fp32", "demo",
                                                                      False)

    if args.shape == "demo":
        rank = args.rank or 4
        setup = demo_setup(rank)
        items, collate = real_items(args.batch or 32)
        batch = collate(items)
        what = (f"demo model (MiniLM-L6, 36 matrices), rank {rank}, batch {args.batch or 32}")
    else:
        setup, rank, batch, shape = paper_shape(args.shape, args.rank, args.tiny, args.batch,
                                                args.models)
        what = (f"{args.shape}{' (tiny)' * args.tiny}, random weights, r0 {rank} "
                f"(b(T) {setup.budget}), LoRA r {rank}, batch {shape}")
    # + 10 on CUDA: the steps host_syncs takes before the timed rounds
    total = 2 + args.rounds * args.steps + 10 + 10 * cuda
    kw = {"setup": setup, "device": device, "precision": args.precision}
    steppers = {m: make_stepper(m, rank, total, batch, **kw) for m in ("adalora", "lora")}
    try:  # the bench extra; without it the PEFT line is left out, not faked
        steppers["peft-adalora"] = make_peft_stepper(rank, total, batch, **kw)
    except ImportError:
        print("peft not installed (pip install -e '.[bench]'): PEFT's AdaLoRA step skipped")
    syncs = {m: host_syncs(steppers[m]) for m in ("adalora", "lora")} if cuda else {}
    med = alternate(steppers, list(steppers), args.rounds, args.steps, cuda)
    if default:
        print(f"{what}, {args.rounds} rounds x {args.steps} steps, "
              f"{torch.get_num_threads()} threads")
    else:
        where = torch.cuda.get_device_name(device) if cuda else (
            f"cpu, {torch.get_num_threads()} threads")
        print(f"{what}, {args.rounds} rounds x {args.steps} steps, {where}, "
              f"{args.precision}")
    for m in ("lora", "adalora", "peft-adalora"):
        if m in med:
            print(f"  {m:12s} median step {med[m] * 1000:8.1f} ms")
    if syncs:
        print(f"host syncs per step: {syncs['adalora']:g} (AdaLoRA), {syncs['lora']:g} (LoRA)")
    ratio = med["adalora"] / med["lora"]
    print(f"AdaLoRA / LoRA step-time ratio: {ratio:.3f}  (target <= 1.03)")
    if "peft-adalora" in med:
        print(f"our AdaLoRA / PEFT's AdaLoRA step-time ratio: "
              f"{med['adalora'] / med['peft-adalora']:.3f}"
              + ("" if default else "  (goal <= 0.90)"))
    if args.split > 1 and args.shape != "demo":
        print(f"--split {args.split}: the length_split line needs the demo's real, "
              "ragged batch; left out for --shape")
    elif args.split > 1:
        # its own alternating rounds against the whole batch: interleaving the narrow
        # pieces with the three steps above would bill their buffer regrowth to a neighbour
        pieces = LengthSplit(collate, args.split)(items)
        steppers["adalora-split"] = make_stepper("adalora", rank, total, pieces, **kw)
        med = alternate(steppers, ["adalora", "adalora-split"], args.rounds, args.steps,
                        cuda)
        print(f"same AdaLoRA step, the batch whole vs in {args.split} length-sorted pieces "
              f"(train.length_split; padding {100 * padding([(batch, 1.0)]):.1f} % -> "
              f"{100 * padding(pieces):.1f} %): {med['adalora'] * 1000:.1f} ms vs "
              f"{med['adalora-split'] * 1000:.1f} ms")
        print(f"length_split={args.split} / whole-batch step-time ratio: "
              f"{med['adalora-split'] / med['adalora']:.3f}")


def alternate(steppers: dict, names: list[str], rounds: int, steps: int,
              cuda: bool = False) -> dict[str, float]:
    """Median seconds per step of each named stepper, rounds alternating their order. On
    CUDA a round is timed between two synchronize() calls (none inside: a sync per step
    would serialize the host with the GPU and hide what the steps' own syncs cost)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for m in names:  # warm-up: allocator buffers, autograd graph caches
        steppers[m]()
        steppers[m]()
    times: dict[str, list[float]] = {m: [] for m in names}
    for r in range(rounds):
        for m in (names if r % 2 == 0 else names[::-1]):
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                steppers[m]()
            sync()
            times[m].append((time.perf_counter() - start) / steps)
    return {m: statistics.median(v) for m, v in times.items()}

if __name__ == "__main__":
    main()
