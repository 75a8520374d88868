"""Where a training step's time goes on a busy machine: the demo's AdaLoRA step on an idle
machine and beside busy processes, by thread count and by length-split piece count.

A sweep's jobs run beside each other, and on a busy machine our lead over Trainer + PEFT
nearly vanishes (issue #52); the length-split step runs several small parallel regions per
step, each of which wakes every OpenMP thread. This profiles the loop's own step (built by
step_time.py's ``make_stepper``) on the demo's first real batch, cut into
``train.length_split`` pieces as the loop cuts it, each thread count in a fresh process
(OpenMP sizes its pool and reads its wait policy when torch starts; the piece counts run
one after the other in it), and prints per step:

- the median wall time, and in it each piece's forward + backward and the rest (clipping,
  AdamW, the allocator's after-step);
- threads: ``OMP_NUM_THREADS`` and the wait policy, the CPU time the process used per
  second of wall time (how many cores it kept busy), and the context switches per step,
  voluntary (a thread slept: ``PASSIVE`` waits) and involuntary (a thread was preempted:
  another process took its core);
- parallel regions: the ATen operator calls per step that do the work (leaf operators),
  and of them those whose first input has at least 32,768 elements, ATen's grain size,
  below which an operator runs on one thread: an estimate of the parallel regions a step
  opens (BLAS calls parallelize on their own terms).

``--busy K`` starts K processes that each keep one core busy for the busy arms, as another
job of a sweep would. The wait policy is the one ``adalora`` picks there (``ACTIVE`` idle,
``PASSIVE`` busy) unless ``--policy`` says otherwise.

    python benchmarks/busy_step.py                         # threads 1 and all, pieces 1 and 4
    python benchmarks/busy_step.py --threads 1,2 --pieces 1,2,4 --steps 20 --busy 1
    python benchmarks/busy_step.py --tiny                  # the tiny smoke model: a harness check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMOKE = ROOT / "configs" / "smoke" / "glue.yaml"
GRAIN = 32768
"""ATen's ``at::internal::GRAIN_SIZE``: a pointwise or reduction operator over fewer
elements runs on the calling thread alone, without a parallel region."""


def spin() -> None:  # one core's worth of someone else's work
    while True:
        pass


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise ValueError(f"{what} {text!r}: give whole numbers, e.g. 1,2") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what} {text!r}: give counts of 1 or more, e.g. 1,2")
    return values


def _batch(tiny: bool, pieces: int):
    """The first real batch of the demo (or, tiny, of the smoke config) in ``pieces``
    length-sorted pieces, and the Setup its stepper is built from."""
    from step_time import DEMO, Setup, real_items

    from adalora_cli.config import load_config
    from adalora_cli.engine.build import load_model, resolve_resources
    from adalora_cli.engine.split import LengthSplit
    from adalora_cli.tasks import get_task

    if tiny:  # 12 matrices at r0 4, b(T) 24; the fixture's first batch of 8
        cfg = resolve_resources(load_config(SMOKE))
        task = get_task(cfg)
        _, tokenizer = load_model(task, cfg)
        data = task.load_data(tokenizer)
        items, collate = [data.train[i] for i in range(cfg.train.batch_size)], data.collate
        setup = Setup(SMOKE, [], 24, 2)
    else:  # the demo's rank and budget: r0 4, b(T) 72 over 36 matrices
        cfg = load_config(DEMO)
        items, collate = real_items(cfg.train.batch_size)
        setup = Setup(DEMO, [], cfg.adalora.budget, cfg.lora.r)
    return LengthSplit(collate, pieces)(items), setup, cfg.adalora.init_rank


def _leaf_ops(step) -> tuple[int, int]:
    """(leaf ATen operator calls, those over at least GRAIN elements) in one step."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CPU],
                                            record_shapes=True) as prof:
        warnings.simplefilter("ignore")
        step()
    calls = parallel = 0
    for event in prof.events():
        if not event.name.startswith("aten::") or any(
                c.name.startswith("aten::") for c in event.cpu_children):
            continue
        calls += 1
        shapes = [s for s in (event.input_shapes or []) if isinstance(s, list) and s]
        if shapes:
            numel = 1
            for n in shapes[0]:
                numel *= n
            parallel += numel >= GRAIN
    return calls, parallel


def measure(tiny: bool, counts: list[int], steps: int) -> list[dict]:
    """This process's step (its thread count and wait policy) in each of ``counts`` pieces,
    one after the other, each measured ``steps`` times."""
    import torch
    import transformers
    from step_time import make_stepper

    from adalora_cli.engine.step import Stepper

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    piece_times: list[float] = []
    backward = Stepper.backward

    def timed(self, *args, **kwargs):  # each piece's forward + backward
        start = time.perf_counter()
        try:
            return backward(self, *args, **kwargs)
        finally:
            piece_times.append(time.perf_counter() - start)

    Stepper.backward = timed
    out = []
    for count in counts:
        batch, setup, rank = _batch(tiny, count)
        step = make_stepper("adalora", rank, steps + 10, batch, setup=setup)
        step()  # warm-up: allocator buffers, autograd graph caches
        step()
        rows = []
        for _ in range(steps):
            piece_times.clear()
            usage, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            rows.append({"wall": wall, "cpu": time.process_time() - cpu,
                         "pieces": list(piece_times),
                         "voluntary": after.ru_nvcsw - usage.ru_nvcsw,
                         "involuntary": after.ru_nivcsw - usage.ru_nivcsw})
        calls, parallel = _leaf_ops(step)
        med = statistics.median
        out.append({
            "threads": torch.get_num_threads(), "policy": os.environ.get("OMP_WAIT_POLICY"),
            "pieces": len(batch), "tokens": [int(b["attention_mask"].numel()) for b, _ in batch],
            "step": med(r["wall"] for r in rows),
            "piece": [med(r["pieces"][j] for r in rows) for j in range(len(batch))],
            "rest": med(r["wall"] - sum(r["pieces"]) for r in rows),
            "cores_busy": sum(r["cpu"] for r in rows) / sum(r["wall"] for r in rows),
            "voluntary": med(r["voluntary"] for r in rows),
            "involuntary": med(r["involuntary"] for r in rows),
            "ops": calls, "parallel_ops": parallel, "steps": steps})
    return out


def run_arms(tiny: bool, threads: int, pieces: list[int], steps: int, policy: str) -> list[dict]:
    """One fresh process of ``threads`` threads under ``policy``, each piece count in it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OMP_WAIT_POLICY": policy, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, __file__, "--child", "--pieces", ",".join(map(str, pieces)),
           "--steps", str(steps), *(["--tiny"] if tiny else [])]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the arms of {threads} thread(s) failed "
                         f"(exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_machines(tiny: bool, threads: list[int], pieces: list[int], steps: int,
                     busy: int, policy: str | None) -> list[dict]:
    rows = []
    for machine, hogs in (("idle", 0), (f"busy {busy}", busy)):
        if hogs == 0 and machine != "idle":
            continue
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(hogs)]
        for p in spinners:
            p.start()
        try:
            chosen = policy or ("PASSIVE" if hogs else "ACTIVE")  # as adalora picks it
            for n in threads:
                got = run_arms(tiny, n, pieces, steps, chosen)
                try:
                    load = os.getloadavg()[0]
                except (AttributeError, OSError):
                    load = None
                for arm in got:
                    rows.append({"machine": machine, "busy": hogs, "load": load, **arm})
                    print_row(rows[-1])
        finally:
            for p in spinners:
                p.terminate()
                p.join()
    return rows


def print_row(r: dict) -> None:
    pieces = " + ".join(f"{1000 * t:.1f}" for t in r["piece"])
    load = "n/a" if r["load"] is None else f"{r['load']:.2f}"
    print(f"  {r['machine']:7s} {r['threads']:2d} thr {r['policy']:7s} {r['pieces']:2d} pc  "
          f"step {1000 * r['step']:8.1f} ms = pieces {pieces} + rest {1000 * r['rest']:.1f}   "
          f"cores busy {r['cores_busy']:.2f}   switches vol {r['voluntary']:.0f} "
          f"invol {r['involuntary']:.0f}   ops {r['ops']} (parallel ~{r['parallel_ops']})   "
          f"load {load}", flush=True)


def compare(rows: list[dict]) -> list[str]:
    """Each thread and piece count's busy step over its idle one: what the load costs."""
    lines = []
    idle = {(r["threads"], r["pieces"]): r for r in rows if r["busy"] == 0}
    for r in rows:
        base = idle.get((r["threads"], r["pieces"]))
        if r["busy"] and base:
            lines.append(f"{r['threads']} thread(s), {r['pieces']} piece(s): busy / idle step "
                         f"{r['step'] / base['step']:.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    parser.add_argument("--threads", default=",".join(map(str, sorted({1, cores}))),
                        help="comma-separated OMP_NUM_THREADS values (default 1 and the cores)")
    parser.add_argument("--pieces", default="1,4",
                        help="comma-separated train.length_split values (default 1,4)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    parser.add_argument("--busy", type=int, default=1,
                        help="processes keeping a core busy in the busy arms (0: idle only)")
    parser.add_argument("--policy", choices=["ACTIVE", "PASSIVE"], default=None,
                        help="OMP_WAIT_POLICY for every arm (default: ACTIVE idle, "
                             "PASSIVE busy, as adalora picks it)")
    parser.add_argument("--tiny", action="store_true",
                        help="the smoke config's tiny model and first batch: seconds")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if args.steps < 1 or args.busy < 0:
            raise ValueError(f"--steps takes 1 or more and --busy 0 or more, got --steps "
                             f"{args.steps} --busy {args.busy}")
        pieces = _ints(args.pieces, "--pieces")
        threads = _ints(args.threads, "--threads")
    except ValueError as e:
        parser.error(str(e))
    sys.path.insert(0, str(ROOT))
    if args.child:
        print(json.dumps(measure(args.tiny, pieces, args.steps)))
        return
    batch = 8 if args.tiny else 32
    if max(pieces) > batch:
        parser.error(f"--pieces {args.pieces}: at most the batch of {batch} examples")
    print(f"{'tiny smoke' if args.tiny else 'demo'} AdaLoRA step, batch {batch}, "
          f"{args.steps} timed steps per arm, {cores} CPUs, a fresh process per thread count")
    rows = profile_machines(args.tiny, threads, pieces, args.steps, args.busy, args.policy)
    for line in compare(rows):
        print(line)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
