"""Memory and step time of a 4-bit NF4 frozen base (``model.quantize=nf4``) against fp32 and
bf16 bases, on the LLM demo's model and chats.

The LLM demo (configs/demo/smollm2_bbc_topic.yaml: SmolLM2-135M-Instruct, 210 adapted
matrices, AdaLoRA r0 4, batches of 4 chats) trains on one batch of its real chats, the same
batch every step for every arm, with the training loop's own step
(step_time.make_stepper: forward, loss, backward, clipping, AdamW, the allocator's
after-step). The arms differ only in the frozen base, made as a run's build makes it:

- ``fp32``: the base in fp32, no autocast;
- ``bf16``: the base cast to bf16 (``model.base_dtype=bf16``), bf16 autocast;
- ``nf4``: the base's linear weights in NF4, dequantized to fp32 in each forward;
- ``nf4-bf16``: NF4 dequantized to bf16, under bf16 autocast.

The demo's file is a Q4_1 GGUF, which a run refuses to quantize again; here its dequantized
weights are quantized to NF4 all the same, since neither memory nor time depends on the
values. Per arm: the bytes of the frozen base (NF4 at its packed size: 4-bit codes plus the
blocks' 8-bit scales), and the median step and its peak memory above what the arm held
before the step (on CUDA ``max_memory_allocated``; on a CPU the process's VmHWM over VmRSS,
Linux only). Rounds alternate between the arms (5 by default) so machine noise lands on all;
then the ratios against the fp32 base. ``--tiny``: the causal-LM smoke config (a 2-layer
random Llama whose 37-wide FFN stays in fp32), a CPU check.

    python benchmarks/nf4_base.py --device cuda
    python benchmarks/nf4_base.py --tiny --rounds 1 --steps 1
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import torch
from llm_tokens import DEMO, TINY, demo_batch
from step_time import Setup, make_stepper

from adalora_cli.engine.build import cast_frozen
from adalora_cli.engine.quantize import frozen_linears, quantize_base
from adalora_cli.methods.base import is_nf4

ARMS = {"fp32": (torch.float32, False), "bf16": (torch.bfloat16, False),
        "nf4": (torch.float32, True), "nf4-bf16": (torch.bfloat16, True)}
"""Arm -> (the base's dtype, and the dtype its linears compute in when NF4; NF4 or not)."""
MiB = 1 << 20


def stored_bytes(t: torch.Tensor) -> int:
    """What a tensor keeps in memory: an NF4 tensor's packed codes, scales and table."""
    if is_nf4(t):
        names, _ = t.__tensor_flatten__()
        return sum(getattr(t, name).nbytes for name in names)
    return t.nbytes


def base_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of every frozen parameter, bytes of the frozen backbone linears' weights)."""
    frozen = sum(stored_bytes(p) for p in model.parameters() if not p.requires_grad)
    linears = sum(stored_bytes(m.weight) for _, m in frozen_linears(model))
    return frozen, linears


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status (Linux only)")


class Peak:
    """The peak memory of what runs inside, above what was held when it began."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.value = 0

    def __enter__(self) -> Peak:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS
            self.start = _status("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            top = torch.cuda.max_memory_allocated(self.device)
        else:
            top = _status("VmHWM")
        self.value = max(self.value, top - self.start)


def make_arm(name: str, config: Path, batch: dict, budget: int, r0: int, total: int,
             device: torch.device):
    """One arm's step function and its model (AdaLoRA at the config's r0)."""
    dtype, nf4 = ARMS[name]
    half = dtype is torch.bfloat16
    overrides = ["model.base_dtype=bf16"] if half else []
    held = {}

    def base(model, handle) -> None:  # as build_run makes the base, after the method
        cast_frozen(model, dtype)
        if nf4:
            quantize_base(model)
        held["model"] = model

    step = make_stepper("adalora", r0, total, batch, device=device,
                        setup=Setup(config, overrides, budget, None, "CAUSAL_LM"),
                        precision="bf16" if half else "fp32", tweak=base)
    return step, held["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per round per arm")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tiny", action="store_true",
                        help="the causal-LM smoke config's tiny model: a CPU check")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps take 1 or more")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    import logging

    import transformers
    for name in ("torchao", "torch.utils._pytree"):  # torchao's import reports (as the CLI)
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = TINY if args.tiny else DEMO
    cfg, targets, batch = demo_batch(config, None)
    tokens = int(batch["attention_mask"].sum())
    r0 = cfg.adalora.init_rank
    budget = cfg.adalora.final_budget(len(targets))
    total = 2 + (args.rounds + 1) * args.steps + 10
    arms = {name: make_arm(name, config, batch, budget, r0, total, device) for name in ARMS}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peaks = {name: Peak(device) for name in ARMS}
    for name, (step, _) in arms.items():  # warm-up: allocations, autograd caches
        step()
        with peaks[name]:
            step()
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    names = list(ARMS)
    for i in range(args.rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            step = arms[name][0]
            sync()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            times[name].append((time.perf_counter() - start) / args.steps)
    where = torch.cuda.get_device_name(device) if cuda else (
        f"cpu, {torch.get_num_threads()} threads")
    what = "causal-LM smoke model (tiny)" if args.tiny else "LLM demo (SmolLM2-135M-Instruct)"
    print(f"{what}, {len(targets)} matrices, AdaLoRA r0 {r0}, batch "
          f"{tuple(batch['input_ids'].shape)} ({tokens} tokens), {args.rounds} rounds x "
          f"{args.steps} steps, {where}")
    med = {name: statistics.median(v) for name, v in times.items()}
    sizes = {name: base_bytes(model) for name, (_, model) in arms.items()}
    for name in names:
        model = arms[name][1]
        n4 = sum(is_nf4(m.weight) for _, m in frozen_linears(model))
        frozen, linears = sizes[name]
        print(f"  {name:8s} base {frozen / MiB:9.2f} MiB (linears {linears / MiB:9.2f} MiB, "
              f"{n4} in NF4)  step peak +{peaks[name].value / MiB:8.1f} MiB  median step "
              f"{med[name] * 1000:9.1f} ms")
    for name in names[1:]:
        print(f"{name} / fp32: base {sizes[name][0] / sizes['fp32'][0]:.3f}, linears "
              f"{sizes[name][1] / sizes['fp32'][1]:.3f}, step time "
              f"{med[name] / med['fp32']:.3f}")


if __name__ == "__main__":
    main()
