"""Time to a sweep's results, the way users run experiments: the demo's three seeds by
``adalora sweep --jobs 2`` against the same three runs through Hugging Face ``Trainer`` +
PEFT's AdaLoRA, two at a time, both in the same precision.

``time_to_result.py`` times one run on a machine of its own; a sweep runs its jobs beside
each other, so each run shares the cores with another one, which is where the wait policy
and the length-split step's many short parallel regions cost most (issue #52). Here:

- ours: ``adalora sweep CONFIG --seeds 0,1,2 --jobs 2`` in a fresh process, the same runs
  as the AdaLoRA half of experiments/demo_rotten_tomatoes.yaml;
- theirs: ``ttr_hf.py`` (time_to_result.py's Trainer runner) for each seed, two processes
  at a time, the next starting as soon as one ends, as the sweep schedules its jobs.

Both get one environment: the wait policy decided once from the load when the benchmark
starts, and ``OMP_NUM_THREADS`` = cores / jobs, what the sweep gives each of its CPU jobs
(adalora_cli/threads.py). Trainer runs in the precision ours computes in (bf16 where
``train.precision=auto`` picks it, else fp32). Printed: the wall time to the last result of
each side, each run's accuracy, the mean and peak 1-minute load average sampled while each
side ran, and the ratio. Target: ours at most 0.7 of theirs at the same accuracy (within
seed noise). With ``--rounds 2`` or more the two sides alternate which goes first.

    python benchmarks/sweep_to_result.py             # the demo, seeds 0,1,2, 2 at a time
    python benchmarks/sweep_to_result.py --rounds 2 --json
    python benchmarks/sweep_to_result.py --tiny      # the smoke config: the harness check
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from time_to_result import (
    DEMO,
    ROOT,
    LoadSampler,
    child_env,
    load_text,
    our_precision,
    parse_seeds,
    run_one,
)

SMOKE = ROOT / "configs" / "smoke" / "glue.yaml"
TINY = ["adalora.budget=24", "train.max_steps=16"]
"""--tiny: the smoke config's 12 matrices at PEFT's target_r 2, 16 steps."""
TARGET = 0.7


def pool_env(jobs: int) -> dict[str, str]:
    """The one environment of both sides: the wait policy decided now, once, and a share of
    the cores per job, as ``adalora sweep --jobs`` gives its workers (anything the user set
    passes through: the sweep leaves it as it is too)."""
    env = child_env()  # puts the repository on sys.path first
    from adalora_cli import threads

    env.update(threads.child_defaults(env, jobs))
    return env


def run_sweep(config: Path, overrides: list[str], seeds: list[int], jobs: int,
              env: dict[str, str], workdir: Path) -> dict:
    """``adalora sweep`` of ``config`` over ``seeds``, ``jobs`` at a time: its wall time and
    each run's summary, by seed."""
    sweep_dir = workdir / f"ours-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "adalora_cli", "sweep", str(config), *overrides,
           "--seeds", ",".join(map(str, seeds)), "--jobs", str(jobs),
           "--sweep-dir", str(sweep_dir), "--quiet"]
    with LoadSampler() as load:
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    summaries = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))]
    if done.returncode != 0 or sorted(s["seed"] for s in summaries) != sorted(seeds):
        tail = ((done.stderr.strip() or done.stdout.strip()).splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: adalora sweep did not finish its {len(seeds)} runs "
                         f"(exit {done.returncode}): {tail}")
    runs = [{"runner": "ours", "seed": s["seed"],
             "accuracy": next(iter(s["metrics"].values()))["accuracy"],
             "precision": s["precision"]["autocast"], "steps": s["total_steps"],
             "final_budget": s.get("final_budget"), "train": s["train_seconds"]}
            for s in summaries]
    return {"side": "ours", "wall": wall, "loadavg": load.mean, "load_peak": load.peak,
            "runs": sorted(runs, key=lambda r: r["seed"])}


def run_trainer(config: Path, overrides: list[str], seeds: list[int], jobs: int,
                env: dict[str, str], workdir: Path, bf16: bool) -> dict:
    """The same runs through Trainer + PEFT, ``jobs`` processes at a time, each seed's run
    starting as soon as a slot is free: the wall time to the last result."""
    def one(seed: int) -> dict:
        began = time.perf_counter() - start
        r = run_one("hf", config, [*overrides, f"train.seed={seed}"], env, workdir, bf16)
        return {"runner": "hf", "seed": seed, "accuracy": r["accuracy"],
                "precision": r["precision"], "steps": r["steps"],
                "final_budget": r["final_budget"], "train": r["train"],
                "process_wall": r["process_wall"], "began": began,
                "ended": time.perf_counter() - start}  # seconds after the first one began

    with LoadSampler() as load, ThreadPoolExecutor(max_workers=jobs) as pool:
        start = time.perf_counter()
        runs = list(pool.map(one, seeds))
        wall = time.perf_counter() - start
    return {"side": "hf", "wall": wall, "loadavg": load.mean, "load_peak": load.peak,
            "runs": runs}


def measure(config: Path, overrides: list[str], seeds: list[int], jobs: int, rounds: int,
            env: dict[str, str], bf16: bool) -> list[dict]:
    """``rounds`` of both sides, alternating which goes first."""
    out = []
    with tempfile.TemporaryDirectory(prefix="sweep-ttr-") as tmp:
        for k in range(rounds):
            sides = ("ours", "hf") if k % 2 == 0 else ("hf", "ours")
            for side in sides:
                if side == "ours":
                    got = run_sweep(config, overrides, seeds, jobs, env, Path(tmp))
                else:
                    got = run_trainer(config, overrides, seeds, jobs, env, Path(tmp), bf16)
                out.append({"round": k, **got})
    return out


def summarize(results: list[dict]) -> dict:
    out = {}
    for side in ("ours", "hf"):
        mine = [r for r in results if r["side"] == side]
        accs = [run["accuracy"] for r in mine for run in r["runs"]]
        loads = [r["loadavg"] for r in mine if r["loadavg"] is not None]
        out[side] = {"wall": statistics.mean(r["wall"] for r in mine),
                     "accuracy": statistics.mean(accs),
                     "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else None,
                     "loadavg": statistics.mean(loads) if loads else None}
    out["ratio"] = out["ours"]["wall"] / out["hf"]["wall"]
    return out


def print_results(results: list[dict], summary: dict, seeds: list[int], jobs: int,
                  precision: str, env: dict[str, str]) -> None:
    print(f"sweep to result, {len(seeds)} seeds {seeds}, {jobs} at a time, {os.cpu_count()} "
          f"CPUs, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}, both {precision}")
    labels = {"ours": f"adalora sweep --jobs {jobs}", "hf": f"HF Trainer + PEFT, {jobs} at once"}
    for r in results:
        accs = " / ".join(f"{100 * run['accuracy']:.2f}" for run in r["runs"])
        print(f"  {labels[r['side']]:28s} wall {r['wall']:8.1f} s   load avg "
              f"{load_text(r['loadavg'])} (peak {load_text(r['load_peak'])})   accuracy "
              f"{accs} % by seed   round {r['round']}")
    ours, hf = summary["ours"], summary["hf"]

    def acc(side: dict) -> str:
        spread = f" ± {100 * side['accuracy_std']:.2f}" if side["accuracy_std"] is not None \
            else ""
        return f"{100 * side['accuracy']:.2f}{spread} %"

    print(f"sweep-to-result: ours {ours['wall']:.1f} s (load {load_text(ours['loadavg'])}) vs "
          f"HF Trainer + PEFT {hf['wall']:.1f} s (load {load_text(hf['loadavg'])}), ratio "
          f"{summary['ratio']:.3f} (target <= {TARGET}); accuracy {acc(ours)} vs {acc(hf)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="default: the demo (configs/smoke/glue.yaml with --tiny)")
    parser.add_argument("--seeds", default="0,1,2", help="e.g. 0,1,2 (the default)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once on each side")
    parser.add_argument("--rounds", type=int, default=1,
                        help="both sides this many times, alternating which goes first")
    parser.add_argument("--tiny", action="store_true",
                        help="the smoke config for 16 steps: checks the harness in seconds")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both sides")
    args = parser.parse_args()
    config = args.config or (SMOKE if args.tiny else DEMO)
    overrides = [*TINY, *args.overrides] if args.tiny else args.overrides
    if args.jobs < 1 or args.rounds < 1:
        parser.error(f"--jobs and --rounds take 1 or more, got --jobs {args.jobs} "
                     f"--rounds {args.rounds}")
    try:
        seeds = parse_seeds(args.seeds)
        precision = our_precision(config, overrides)
    except ValueError as e:  # ConfigError is one: a bad config or override, said in a line
        parser.error(str(e))
    env = pool_env(args.jobs)
    results = measure(config, overrides, seeds, args.jobs, args.rounds, env,
                      precision == "bf16")
    ran = {run["precision"] for r in results for run in r["runs"]}
    if ran != {precision}:
        raise SystemExit(f"error: the runs computed in {', '.join(sorted(ran))}, not both in "
                         f"the {precision} the config resolves to here: set "
                         "train.precision explicitly")
    summary = summarize(results)
    print_results(results, summary, seeds, args.jobs, precision, env)
    if args.json:
        print(json.dumps({"results": results, "summary": summary}))


if __name__ == "__main__":
    main()
