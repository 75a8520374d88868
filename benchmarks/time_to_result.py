"""Time to a paper number: a task trained and evaluated end to end by our runner and by
Hugging Face ``Trainer`` + PEFT's AdaLoRA, side by side, with wall time, phases and accuracy.

Each run is a fresh process (``ttr_ours.py``, ``ttr_hf.py``), so the wall time is what a
user waits for: interpreter start and imports, model and data, training, evaluation and
writing results. Both processes get the same environment (thread settings included), the
same model, data split, hyperparameters and AdaLoRA schedule; the order of the two
alternates from seed to seed so machine noise lands on both. Target: our wall time at most
0.6x theirs at the same accuracy (within seed noise; issue #32).

    python benchmarks/time_to_result.py                          # the demo, seed 0
    python benchmarks/time_to_result.py --seeds 0,1,2            # 3 seeds when time allows
    python benchmarks/time_to_result.py --seeds 0 --hf-bf16      # Trainer in bf16 too
    python benchmarks/time_to_result.py --config configs/smoke/glue.yaml adalora.budget=24 \\
        train.max_steps=16 --json                                # the harness check, seconds
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
ROOT = HERE.parent
DEMO = ROOT / "configs" / "demo" / "rotten_tomatoes.yaml"
RUNNERS = {"ours": HERE / "ttr_ours.py", "hf": HERE / "ttr_hf.py"}
LABELS = {"ours": "adalora train", "hf": "HF Trainer + PEFT"}
PHASES = ("load", "train", "evaluate", "other")


def child_env() -> dict[str, str]:
    """One environment for both runners: our thread defaults filled in for both alike."""
    sys.path.insert(0, str(ROOT))
    from adalora_cli import threads

    env = dict(os.environ)
    env.update(threads.child_defaults(env))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    return env


def run_one(runner: str, config: Path, overrides: list[str], env: dict[str, str],
            workdir: Path, hf_bf16: bool = False) -> dict:
    out = workdir / f"{runner}-{time.monotonic_ns()}"
    cmd = [sys.executable, str(RUNNERS[runner]), str(config), str(out), *overrides]
    if runner == "hf" and hf_bf16:
        env = {**env, "TTR_HF_BF16": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [x for x in done.stdout.splitlines() if x.startswith("{\"runner\"")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the {LABELS[runner]} run failed (exit {done.returncode}): "
                         f"{tail}")
    result = json.loads(lines[-1])
    result["process_wall"] = wall  # measured from outside: what the user waits for
    return result


def compare(config: Path, overrides: list[str], seeds: list[int],
            env: dict[str, str], hf_bf16: bool = False) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="ttr-") as tmp:
        for k, seed in enumerate(seeds):
            order = ("ours", "hf") if k % 2 == 0 else ("hf", "ours")
            for runner in order:
                result = run_one(runner, config, [*overrides, f"train.seed={seed}"], env,
                                 Path(tmp), hf_bf16)
                rows.append({"seed": seed, **result})
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {}
    for runner in RUNNERS:
        mine = [r for r in rows if r["runner"] == runner]
        out[runner] = {k: statistics.mean(r[k] for r in mine)
                       for k in ("process_wall", *PHASES, "accuracy")}
        accs = [r["accuracy"] for r in mine]
        out[runner]["accuracy_std"] = statistics.stdev(accs) if len(accs) > 1 else None
    out["wall_ratio"] = out["ours"]["process_wall"] / out["hf"]["process_wall"]
    return out


def print_table(rows: list[dict], summary: dict, seeds: list[int], env: dict[str, str]) -> None:
    print(f"time to result, {len(seeds)} seed(s) {seeds}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"  {'runner':18s} {'wall s':>8s} " + " ".join(f"{p:>9s}" for p in PHASES)
          + f" {'accuracy':>9s}  precision")
    for r in rows:
        print(f"  {LABELS[r['runner']]:18s} {r['process_wall']:8.1f} "
              + " ".join(f"{r[p]:9.1f}" for p in PHASES)
              + f" {100 * r['accuracy']:8.2f}%  {r['precision']:9s} seed {r['seed']}, "
              f"{r['steps']} steps")
    ours, hf = summary["ours"], summary["hf"]
    spread = (f" (std {100 * ours['accuracy_std']:.2f} / {100 * hf['accuracy_std']:.2f})"
              if ours["accuracy_std"] is not None else " (one seed: no spread measured)")
    print(f"time-to-result: ours {ours['process_wall']:.1f} s vs HF Trainer + PEFT "
          f"{hf['process_wall']:.1f} s, ratio {summary['wall_ratio']:.3f} (target <= 0.6); "
          f"accuracy {100 * ours['accuracy']:.2f} % vs {100 * hf['accuracy']:.2f} %{spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEMO)
    parser.add_argument("--seeds", default="0", help="e.g. 0,1,2")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--hf-bf16", action="store_true",
                        help="Trainer with bf16=True (its CPU bf16 autocast) instead of its "
                             "default fp32")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runners")
    args = parser.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"error: --seeds must be integers like 0,1,2, got {args.seeds!r}") \
            from None
    if not seeds:
        raise SystemExit("error: --seeds is empty; give at least one, e.g. --seeds 0")
    env = child_env()  # the wait policy follows the load now, once, for every run
    rows = compare(args.config, args.overrides, seeds, env, args.hf_bf16)
    summary = summarize(rows)
    print_table(rows, summary, seeds, env)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}))


if __name__ == "__main__":
    main()
