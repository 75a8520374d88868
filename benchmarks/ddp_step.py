"""Cost of the distributed path: 2 gloo processes vs 1 process at the same global batch.

AdaLoRA on the demo model (MiniLM-L6), global batch 32 of real review snippets: one process
runs the loop's step (``engine.step.Stepper``) on all 32 with every core; two processes
(gloo, CPU, DDP-wrapped, the loop's loss weighting) each run 16 with half the cores. Blocks
alternate so machine noise lands on both; the ratio of median step times is printed. On a
CPU the two sides share the same cores, so the ratio shows the overhead of DDP's gradient
all-reduce and of splitting the batch, not a speed-up.

    python benchmarks/ddp_step.py [--rounds 4] [--steps 5] [--batch 32]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import make_stepper, real_batch  # noqa: E402


def _rank(rank: int, world: int, init: str, batch: dict, steps: int, q) -> None:
    import torch.distributed as dist
    import transformers

    transformers.utils.logging.set_verbosity_error()  # a fresh process: quiet it again
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    n = batch["input_ids"].shape[0]
    lo, hi = rank * n // world, (rank + 1) * n // world
    local = {k: v[lo:hi] for k, v in batch.items()}
    step = make_stepper("adalora", 4, 2 + steps + 10, local, ddp=world > 1)
    step()
    step()  # warm-up
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if rank == 0:
        q.put((time.perf_counter() - start) / steps)
    if world > 1:
        dist.destroy_process_group()


def measure(world: int, batch: dict, steps: int) -> float:
    ctx = mp.get_context("spawn")  # fresh OpenMP state in each process
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        procs = [ctx.Process(target=_rank, args=(r, world, init, batch, steps, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        result = q.get(timeout=1200)
        for p in procs:
            p.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    import transformers
    transformers.utils.logging.set_verbosity_error()
    batch = real_batch(args.batch)
    times: dict[int, list[float]] = {1: [], 2: []}
    for r in range(args.rounds):
        for world in ((1, 2) if r % 2 == 0 else (2, 1)):
            times[world].append(measure(world, batch, args.steps))
    med = {w: statistics.median(v) for w, v in times.items()}
    print(f"demo model, AdaLoRA r0 4, global batch {args.batch}, {args.rounds} rounds x "
          f"{args.steps} steps, {os.cpu_count()} cores")
    print(f"  1 process            median step {med[1] * 1000:8.1f} ms")
    print(f"  2 processes (gloo)   median step {med[2] * 1000:8.1f} ms")
    print(f"2-process DDP / 1-process step-time ratio: {med[2] / med[1]:.3f}")


if __name__ == "__main__":
    main()
