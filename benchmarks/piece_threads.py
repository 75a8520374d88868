"""Could a CPU step's length-split pieces use the second core better? The loop's step
against two ways of running the pieces side by side, on an idle machine.

busy_step.py found that on 2 cores the demo step in 4 pieces gains little from its second
thread (each piece's operators are too small to split well), so the pieces themselves
might run side by side instead, each on one thread:

- ``loop``: the step as the training loop runs it, torch's thread count (the cores);
- ``loop-1``: the same on one thread;
- ``overlap``: the main thread runs each piece's forward on one thread while a worker
  thread runs the previous piece's backward on another. Forwards stay in piece order, so
  dropout draws the masks it always draws, and each piece's gradients are summed in
  piece order: the result is ``loop-1``'s bit for bit (checked, printed);
- ``concurrent``: every piece's forward in order on the main thread (all threads), then
  their backwards at once, one worker of one thread per core, summed in piece order.

Each variant runs in a fresh process (OpenMP sizes its pool per process), warm-up steps
first, in an order that alternates from round to round; the median step time per variant
and its ratio to ``loop`` are printed, with the load average before each round and a hash
of the trained parameters after the same number of steps (equal hashes: equal results).

    python benchmarks/piece_threads.py [--pieces 4] [--steps 15] [--rounds 2]
    python benchmarks/piece_threads.py --tiny          # the smoke model: a harness check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ("loop", "loop-1", "overlap", "concurrent")
WARMUP = 2


class _Workers:
    """``n`` threads that each run a job at a time on one intra-op thread of their own."""

    def __init__(self, n: int):
        import torch

        self.jobs: queue.Queue = queue.Queue()
        threads = torch.get_num_threads()
        ready = threading.Barrier(n + 1)
        for _ in range(n):
            threading.Thread(target=self._work, args=(ready,), daemon=True).start()
        ready.wait()
        # a worker's set_num_threads(1) also sets torch's process-wide count, which new
        # threads start from; the main thread's own stays, and this puts the global back
        torch.set_num_threads(threads)

    def _work(self, ready: threading.Barrier) -> None:
        import torch

        torch.set_num_threads(1)
        ready.wait()
        while True:
            job, box, done = self.jobs.get()
            try:
                box.append(job())
            except BaseException as e:  # handed to the caller, raised there
                box.append(e)
            done.set()

    def submit(self, job) -> tuple[list, threading.Event]:
        box, done = [], threading.Event()
        self.jobs.put((job, box, done))
        return box, done


def _side_by_side(workers: _Workers, overlap: bool):
    """A ``Stepper.backward_pieces`` that runs the pieces' backwards on ``workers``: each
    as soon as its forward is done (``overlap``), or all once every forward is done."""
    import torch

    def backward_pieces(self, pieces, weight=1.0, device=None):
        params = [p for g in self.optimizer.param_groups for p in g["params"]
                  if p.requires_grad]
        totals, waits, loss, reg = [], [], None, None

        def grads(total):
            return lambda: torch.autograd.grad(total, params, allow_unused=True)

        for j, (batch, share) in enumerate(pieces):
            with self.autocast():
                piece_loss = self.model(**batch).loss
            rule = self.handle.regularizer if j == 0 else None  # once, with piece 0
            piece_reg = rule() if rule is not None else None
            w = weight * share
            total = piece_loss * w if w != 1.0 else piece_loss
            if piece_reg is not None:
                total = total + self.handle.reg_weight * piece_reg
                reg = piece_reg.detach()
            total = total / self.grad_accum
            if overlap:
                waits.append(workers.submit(grads(total)))
            else:
                totals.append(total)
            loss = (torch.zeros((), dtype=torch.float64) if loss is None else loss) \
                + piece_loss.detach().double() * share
        waits += [workers.submit(grads(t)) for t in totals]
        per_piece = []
        for box, done in waits:
            done.wait()
            if isinstance(box[0], BaseException):
                raise box[0]
            per_piece.append(box[0])
        for k, p in enumerate(params):  # in piece order, as the loop's backwards add them
            for g in per_piece:
                if g[k] is not None:
                    p.grad = g[k] if p.grad is None else p.grad + g[k]
        return loss, reg

    return backward_pieces


def measure(variant: str, tiny: bool, pieces: int, steps: int) -> dict:
    """This process's step under ``variant``: median seconds, and a hash of the trained
    parameters after WARMUP + ``steps`` steps."""
    import torch
    import transformers
    from busy_step import _batch
    from step_time import make_stepper

    from adalora_cli.engine.step import Stepper

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cores = torch.get_num_threads()
    if variant == "loop-1":
        torch.set_num_threads(1)
    elif variant in ("overlap", "concurrent"):
        overlap = variant == "overlap"
        workers = _Workers(1 if overlap else cores)
        if overlap:
            torch.set_num_threads(1)
        Stepper.backward_pieces = _side_by_side(workers, overlap)
    batch, setup, rank = _batch(tiny, pieces)
    step = make_stepper("adalora", rank, WARMUP + steps + 10, batch, setup=setup)
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    stepper = next(c.cell_contents for c in step.__closure__
                   if isinstance(c.cell_contents, Stepper))
    digest = hashlib.sha256()
    for _, p in sorted(stepper.model.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            digest.update(p.detach().contiguous().numpy().tobytes())
    return {"variant": variant, "step": statistics.median(times), "threads": cores,
            "hash": digest.hexdigest()[:16]}


def run_variant(variant: str, tiny: bool, pieces: int, steps: int, policy: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "CUDA_VISIBLE_DEVICES": "",
           "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, __file__, "--child", variant, "--pieces", str(pieces),
           "--steps", str(steps), *(["--tiny"] if tiny else [])]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the {variant} variant failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(rows: list[dict]) -> list[str]:
    """Per variant: the median over rounds of its step, its ratio to ``loop``, its hash."""
    med = {v: statistics.median(r["step"] for r in rows if r["variant"] == v)
           for v in VARIANTS if any(r["variant"] == v for r in rows)}
    hashes = {r["variant"]: r["hash"] for r in rows}
    lines = [f"  {v:10s} step {1000 * t:8.1f} ms   / loop {t / med['loop']:.3f}   "
             f"params {hashes[v]}" for v, t in med.items()]
    same = hashes["overlap"] == hashes["loop-1"]
    lines.append(f"overlap's result {'equals' if same else 'DIFFERS FROM'} loop-1's "
                 "(the same steps on one thread)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pieces", type=int, default=4, help="length-split pieces per batch")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per variant")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the variants")
    parser.add_argument("--tiny", action="store_true",
                        help="the smoke model's first batch of 8: a harness check")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    batch = 8 if args.tiny else 32
    if args.steps < 1 or args.rounds < 1 or not 2 <= args.pieces <= batch:
        parser.error(f"--steps and --rounds take 1 or more, --pieces 2 to the batch of "
                     f"{batch}; got {args.steps}, {args.rounds}, {args.pieces}")
    sys.path[:0] = [str(HERE), str(ROOT)]
    if args.child:
        print(json.dumps(measure(args.child, args.tiny, args.pieces, args.steps)))
        return
    from adalora_cli import threads

    # decided once, as adalora decides it when a command starts (ACTIVE on an idle machine)
    policy = os.environ.get("OMP_WAIT_POLICY") or threads.wait_policy()
    print(f"{'tiny smoke' if args.tiny else 'demo'} AdaLoRA step, batch {batch} in "
          f"{args.pieces} pieces, {args.steps} timed steps per variant, {os.cpu_count()} "
          f"CPUs, OMP_WAIT_POLICY={policy}")
    rows = []
    for k in range(args.rounds):
        order = VARIANTS if k % 2 == 0 else VARIANTS[::-1]
        print(f"round {k + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for variant in order:
            rows.append({"round": k + 1, **run_variant(variant, args.tiny, args.pieces,
                                                         args.steps, policy)})
            print(f"  {variant:10s} {1000 * rows[-1]['step']:8.1f} ms", flush=True)
    for line in summarize(rows):
        print(line)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
