"""Does ``torch.compile`` pay on the demo? The loop's AdaLoRA step, eager against compiled.

The demo's first ``--steps`` optimizer steps on its real batches, each cut into the config's
``train.length_split`` length-sorted pieces as the loop cuts them (so the compiled model meets
the shapes the loop makes: one per piece length), through the loop's own
:class:`~adalora_cli.engine.step.Stepper`. The compiled run wraps the model in
``torch.compile`` (inductor, torch's default ``dynamic=None``: static shapes first, dynamic
after the first recompile). Each mode runs in a fresh process. Inductor keeps what it
compiled in an on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, by default
``/tmp/torchinductor_$USER``) that a later process reuses, so the compiled model is timed
twice on a cache of its own: cold (a user's first run on a machine) and then warm (every run
after it). Printed per mode: the wall time of all steps (compilation included), the first
step, and the median step over the second half (compiled code, warm).

It answers whether a ``train.compile`` switch could shorten the demo's wall time including
compilation (issue #32): a first step longer than the steps saved over the run says no.

    python benchmarks/compile_step.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def measure(mode: str, steps: int) -> dict:
    """Seconds per step of the demo's first ``steps`` steps, ``mode`` eager or compile."""
    import torch
    import transformers
    from step_time import DEMO, real_items

    from adalora_cli.config import load_config
    from adalora_cli.engine.build import load_model, resolve_resources
    from adalora_cli.engine.precision import decide
    from adalora_cli.engine.split import LengthSplit
    from adalora_cli.engine.step import Stepper
    from adalora_cli.methods import apply_method
    from adalora_cli.tasks import get_task

    transformers.utils.logging.set_verbosity_error()
    cfg = resolve_resources(load_config(DEMO, ["train.precision=fp32"]))
    batch = cfg.train.batch_size
    items, collate = real_items(batch * steps)
    split = LengthSplit(collate, cfg.train.length_split)
    batches = [split(items[i * batch:(i + 1) * batch]) for i in range(steps)]
    torch.manual_seed(0)
    model, _ = load_model(get_task(cfg), cfg)
    handle = apply_method(model, cfg, 360)
    model.train()
    if mode == "compile":
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = 256  # one entry per piece shape
        model = torch.compile(model)
    stepper = Stepper.build(model, handle, cfg.train, 360, decide(cfg, torch.device("cpu")))
    times = []
    for t, pieces in enumerate(batches, 1):
        start = time.perf_counter()
        stepper.backward_pieces(pieces)
        stepper.update(t)
        times.append(time.perf_counter() - start)
    return {"total": sum(times), "first": times[0],
            "median_warm": statistics.median(times[steps // 2:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--mode", choices=("eager", "compile"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # the child: one mode, its numbers as JSON on the last line
        print(json.dumps(measure(args.mode, args.steps)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for name, mode in (("eager", "eager"), ("compile, cold cache", "compile"),
                           ("compile, warm cache", "compile")):
            done = subprocess.run([sys.executable, __file__, "--mode", mode, "--steps",
                                   str(args.steps)], capture_output=True, text=True,
                                  check=True, env=env)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"demo AdaLoRA step, first {args.steps} steps, length_split pieces, fresh process "
          "per line")
    for name, r in results.items():
        print(f"  {name:20s} all steps {r['total']:7.1f} s   first step {r['first']:7.2f} s"
              f"   median warm step {r['median_warm'] * 1000:6.0f} ms")
    eager = results["eager"]["median_warm"]
    for name in ("compile, cold cache", "compile, warm cache"):
        r = results[name]
        saved, cost = eager - r["median_warm"], r["first"] - r["median_warm"]
        print(f"{name}: warm step {r['median_warm'] / eager:.3f}x eager; compilation (first "
              f"step minus a warm one) {cost:.1f} s, "
              + (f"repaid after {cost / saved:.0f} steps" if saved > 0 else "never repaid"))


if __name__ == "__main__":
    main()
