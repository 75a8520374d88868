"""Operations per training step: LoRA, AdaLoRA, and AdaLoRA with Eq. 3's ``lam`` product
as autograd's plain multiply (before ``methods/scaled_rank.py``), counted, not timed.

On a GPU each operation that computes is a kernel launch, and the step is bound by the host's
launches (docs/gpu.md#where-the-step-goes), so their count says what a change saves before a
GPU times it. Counted here at the dispatcher, where a CPU run sees the same operations a CUDA
run launches (views and allocations left out: they launch nothing), over one step of the
loop's own stepper (step_time.make_stepper) without a mask event: forward, backward,
clipping, AdamW and the allocator's after-step. The CPU's AdamW is the foreach one where CUDA's
is fused, so the optimizer's share differs on a GPU; Eq. 3's does not.

    python benchmarks/step_ops.py --precision bf16 --shape bart-large --tiny
"""

from __future__ import annotations

import argparse
import collections

import torch
from step_profile import VARIANTS, _skip_to_mask_free
from step_time import demo_setup, make_stepper, paper_shape, real_batch
from torch.utils._python_dispatch import TorchDispatchMode

FREE = {"view", "_unsafe_view", "t", "permute", "expand", "detach", "empty", "empty_like",
        "empty_strided", "as_strided", "alias", "_reshape_alias", "unsqueeze", "squeeze",
        "transpose", "slice", "select", "split", "split_with_sizes", "unbind", "reshape"}
"""Operations that compute nothing (views, allocations): no kernel on a GPU."""


class Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count_step(step) -> collections.Counter:
    """Operations of one step without a mask event, after two warm-up steps."""
    step()
    step()
    _skip_to_mask_free(step)
    with Counter() as mode:
        step()
    return mode.ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--shape", choices=["demo", "deberta-v3-base", "bart-large"],
                        default="demo")
    parser.add_argument("--tiny", action="store_true", help="--shape at narrow widths")
    parser.add_argument("--batch", type=int, default=None)
    args = parser.parse_args()
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.shape == "demo":
        rank = 4
        setup, batch = demo_setup(rank), real_batch(args.batch or 8)
    else:
        setup, rank, batch, _ = paper_shape(args.shape, None, args.tiny, args.batch, None)
    kw = {"setup": setup, "precision": args.precision}
    handles = []
    arms = {"lora": make_stepper("lora", rank, 100, batch, **kw),
            "adalora": make_stepper("adalora", rank, 100, batch,
                                    tweak=lambda model, handle: handles.append(handle), **kw)}
    method, tweak, _ = VARIANTS["adalora-plain-eq3"]
    arms["adalora-plain-eq3"] = make_stepper(method, rank, 100, batch, tweak=tweak, **kw)
    counts = {name: count_step(step) for name, step in arms.items()}
    matrices = len(handles[0].layers)
    print(f"{args.shape}{' (tiny)' * args.tiny}, {matrices} adapted matrices, rank {rank}, "
          f"{args.precision}: operations per step (a GPU's kernel launches)")
    for name, ops in counts.items():
        print(f"  {name:18s} {sum(ops.values()):7d}")
    for name in ("adalora", "adalora-plain-eq3"):
        extra = sum(counts[name].values()) - sum(counts["lora"].values())
        print(f"{name} - lora: {extra:+d} ({extra / matrices:+.2f} per adapted matrix)")
    saved = counts["adalora-plain-eq3"] - counts["adalora"]
    added = counts["adalora"] - counts["adalora-plain-eq3"]
    print("Eq. 3's autograd function against the plain multiply: "
          + ", ".join([f"-{n} {k}" for k, n in sorted(saved.items())]
                      + [f"+{n} {k}" for k, n in sorted(added.items())]) if saved or added
          else "Eq. 3's autograd function against the plain multiply: the same operations")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
