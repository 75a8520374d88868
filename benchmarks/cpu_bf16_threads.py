"""bf16 against fp32 on the CPU, by thread count: does ``train.precision=bf16`` pay here?

The demo's AdaLoRA training step (the loop's own :class:`~adalora_cli.engine.step.Stepper`,
built by step_time.py's ``make_stepper``) on the demo's first real batch, cut into the
config's ``train.length_split`` pieces as the loop cuts it, in three arms that alternate
order from round to round:

- ``fp32``: what ``train.precision=auto`` runs on a CPU today;
- ``bf16``: bf16 autocast, base weights and adapters fp32 (``train.precision=bf16``);
- ``bf16+base``: bf16 autocast over bf16-stored frozen weights (``model.base_dtype=bf16``).

Each thread count runs in a fresh process with ``OMP_NUM_THREADS`` set (the OpenMP pool is
sized when torch starts) under ``OMP_WAIT_POLICY`` (``ACTIVE`` unless the environment says
otherwise: ``adalora train`` picks it on an idle machine, adalora_cli/threads.py). It answers
issue #32's question of where bf16 pays: ``auto`` may pick it only where the ratio is below 1
at the thread counts users run.

``--random-weights`` times a copy of the demo's model folder (same config and tokenizer) with
freshly initialised weights, for a machine without the offline package that holds the
weights: the step's arithmetic is the same, its accuracy is not measured here.

    python benchmarks/cpu_bf16_threads.py                      # 1, 2, ... up to the cores
    python benchmarks/cpu_bf16_threads.py --threads 2,8,16 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ARMS = {"fp32": ("fp32", []), "bf16": ("bf16", []),
        "bf16+base": ("bf16", ["model.base_dtype=bf16"])}


def random_copy(folder: Path) -> Path:
    """The demo's model folder with random weights of the same architecture, in ``folder``."""
    import shutil

    import transformers
    from step_time import DEMO

    from adalora_cli.config import load_config
    from adalora_cli.engine.build import resolve_resources

    source = Path(resolve_resources(load_config(DEMO)).model.name_or_path)
    target = folder / "demo-model-random"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    transformers.utils.logging.disable_progress_bar()
    transformers.set_seed(0)
    config = transformers.AutoConfig.from_pretrained(target)
    transformers.AutoModel.from_config(config).save_pretrained(target)
    return target


def measure(rounds: int, steps: int, model: str | None) -> dict:
    """Median seconds per step of each arm, in this process (its thread count)."""
    import torch
    import transformers
    from step_time import DEMO, Setup, alternate, make_stepper, real_items

    from adalora_cli.config import load_config
    from adalora_cli.engine.split import LengthSplit

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = load_config(DEMO)
    where = [f"model.name_or_path={model}"] if model else []
    items, collate = real_items(cfg.train.batch_size, where)
    pieces = LengthSplit(collate, cfg.train.length_split)(items)
    total = 4 + rounds * steps + 10
    steppers = {}
    for arm, (precision, extra) in ARMS.items():
        # the demo's rank and budget: r0 4, b(T) 72 over 36 matrices
        setup = Setup(DEMO, [*where, *extra], cfg.adalora.budget, cfg.lora.r)
        steppers[arm] = make_stepper("adalora", cfg.adalora.init_rank, total, pieces,
                                     setup=setup, precision=precision)
    med = alternate(steppers, list(ARMS), rounds, steps)
    return {"threads": torch.get_num_threads(), "split": cfg.train.length_split, **med}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    default = ",".join(str(n) for n in sorted({*(2 ** k for k in range(8) if 2 ** k < cores),
                                               cores}))
    parser.add_argument("--threads", default=default,
                        help=f"comma-separated thread counts (default {default})")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3, help="steps per round per arm")
    parser.add_argument("--random-weights", action="store_true",
                        help="time a random-weight copy of the demo's model")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds, args.steps, args.model)))
        return
    try:
        counts = [int(n) for n in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads!r}: give whole numbers, e.g. 1,2,4")
    if not counts or min(counts) < 1:
        parser.error(f"--threads {args.threads!r}: give thread counts of 1 or more")
    from adalora_cli.engine.precision import cpu_bf16_native

    policy = os.environ.get("OMP_WAIT_POLICY", "ACTIVE")
    with tempfile.TemporaryDirectory(prefix="bf16-threads-") as tmp:
        model = str(random_copy(Path(tmp))) if args.random_weights else None
        print(f"demo AdaLoRA step (r0 4, b(T) 72), {args.rounds} rounds x {args.steps} "
              f"steps per arm, {'random' if model else 'the package'} weights, "
              f"{cores} cores, native bf16: {cpu_bf16_native()}, OMP_WAIT_POLICY={policy}")
        print(f"{'threads':>7s} {'fp32 ms':>9s} {'bf16 ms':>9s} {'bf16/fp32':>9s} "
              f"{'bf16+base ms':>12s} {'+base/fp32':>10s}")
        for n in counts:
            env = {**os.environ, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n),
                   "OMP_WAIT_POLICY": policy, "CUDA_VISIBLE_DEVICES": ""}
            cmd = [sys.executable, __file__, "--child", "--rounds", str(args.rounds),
                   "--steps", str(args.steps), *(["--model", model] if model else [])]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{n} threads failed:\n{done.stderr.strip()[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            fp32, bf16, base = (got[a] * 1000 for a in ARMS)
            print(f"{got['threads']:7d} {fp32:9.1f} {bf16:9.1f} {bf16 / fp32:9.3f} "
                  f"{base:12.1f} {base / fp32:10.3f}", flush=True)


if __name__ == "__main__":
    main()
