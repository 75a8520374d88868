"""Does ``torch.compile`` pay? The loop's steps, eager against compiled, with the compile time.

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

``--shape deberta-v3-base`` or ``bart-large`` (issue #49) times each of ``--methods`` (AdaLoRA
and LoRA) the same way at that paper shape, on step_time.py's random-weight model and
synthetic batch (``--tiny``: narrow widths, a CPU check), through step_time.make_stepper:
eager, then compiled (``model.compile``, mode ``reduce-overhead`` on CUDA: CUDA graphs, one
replay instead of thousands of launches; inductor's default on the CPU) on a cold and then a
warm cache. Each line says the first step, the compile time (the first step minus a warm
one) beside the median warm step, and after how many steps compiling is repaid; then
AdaLoRA / LoRA eager and compiled. Set ``--modes`` to run fewer (compiling BART-large took
more than 4 minutes on an H100's host).

    python benchmarks/compile_step.py [--steps 60]
    python benchmarks/compile_step.py --shape bart-large --device cuda --precision bf16
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


def measure_shape(mode: str, steps: int, method: str, shape: str, tiny: bool, device: str,
                  precision: str, models: str) -> dict:
    """Seconds per step of ``method``'s first ``steps`` steps at a paper shape, ``mode``
    eager or compile; each step timed alone (synchronized on CUDA)."""
    import torch
    import transformers
    from step_time import make_stepper, paper_shape

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    where = torch.device(device)
    cuda = where.type == "cuda"
    setup, rank, batch, _ = paper_shape(shape, None, tiny, None, Path(models))

    def compiled(model, handle) -> None:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = 64
        # CUDA graphs replay the step's launches as one; the CPU has no graphs to replay
        model.compile(mode="reduce-overhead" if cuda else None)

    step = make_stepper(method, rank, steps + 20, batch, setup=setup, device=where,
                        precision=precision, tweak=compiled if mode == "compile" else None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return {"total": sum(times), "first": times[0],
            "median_warm": statistics.median(times[steps // 2:])}


MODES = {"eager": ("eager", "eager"), "compile-cold": ("compile, cold cache", "compile"),
         "compile-warm": ("compile, warm cache", "compile")}
"""--modes names: (printed name, the child's mode). The warm cache is what the method's cold
run left (without a cold run, its first compile fills it)."""


def shapes(args) -> None:
    """--shape: each method in each mode in a fresh process, then the comparison."""
    methods = [m for m in args.methods.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    results: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as root:
        models = str(Path(root) / "models")
        for method in methods:  # a cache of its own: cold is cold for each method
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(root) / method)}
            for mode in modes:
                name, child = MODES[mode]
                done = subprocess.run(
                    [sys.executable, __file__, "--mode", child, "--method", method,
                     "--steps", str(args.steps), "--shape", args.shape, "--device",
                     args.device, "--precision", args.precision, "--models", models]
                    + ["--tiny"] * args.tiny, capture_output=True, text=True, env=env)
                if done.returncode:
                    sys.exit(f"error: {method} {name} failed:\n{done.stderr[-3000:]}")
                results[method, name] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{args.shape}{' (tiny)' * args.tiny}, {args.device}, {args.precision}, first "
          f"{args.steps} steps, a fresh process per line")
    for (method, name), r in results.items():
        line = (f"  {method:8s} {name:20s} first step {r['first']:8.2f} s   median warm step "
                f"{r['median_warm'] * 1000:8.1f} ms")
        eager = results.get((method, "eager"))
        if name != "eager":
            cost = r["first"] - r["median_warm"]
            line += f"   compile time {cost:7.1f} s"
            if eager:
                saved = eager["median_warm"] - r["median_warm"]
                line += (f"   {r['median_warm'] / eager['median_warm']:.3f}x eager, "
                         + (f"repaid after {cost / saved:.0f} steps" if saved > 0
                            else "never repaid"))
        print(line)
    if {"adalora", "lora"} <= set(methods):
        for _, name in (MODES[m] for m in modes):
            ratio = (results["adalora", name]["median_warm"]
                     / results["lora", name]["median_warm"])
            print(f"AdaLoRA / LoRA median warm step, {name}: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--shape", choices=("demo", "deberta-v3-base", "bart-large"),
                        default="demo")
    parser.add_argument("--tiny", action="store_true",
                        help="--shape at narrow widths and small batches (a CPU check)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="for --shape (the demo's line is the CPU's)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="for --shape")
    parser.add_argument("--methods", default="adalora,lora", help="for --shape")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"for --shape, of {','.join(MODES)}")
    parser.add_argument("--mode", choices=("eager", "compile"), help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--models", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode and args.shape != "demo":  # a --shape child
        print(json.dumps(measure_shape(args.mode, args.steps, args.method, args.shape,
                                       args.tiny, args.device, args.precision, args.models)))
        return
    if args.mode:  # the child: one mode, its numbers as JSON on the last line
        print(json.dumps(measure(args.mode, args.steps)))
        return
    if args.shape != "demo":
        bad = (sorted(set(args.methods.split(",")) - {"adalora", "lora"})
               + sorted(set(args.modes.split(",")) - set(MODES)))
        if bad:
            parser.error(f"unknown {', '.join(bad)}: --methods takes adalora,lora, --modes "
                         f"{','.join(MODES)}")
        if args.device == "cuda":
            import torch
            if not torch.cuda.is_available():
                parser.error("--device cuda: no CUDA device here")
        shapes(args)
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
