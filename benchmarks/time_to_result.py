"""Time to a paper number: a task trained and evaluated end to end by our runner and by
Hugging Face ``Trainer`` + PEFT's AdaLoRA, side by side, with wall time, phases and accuracy.

Each run is a fresh process (``ttr_ours.py``, ``ttr_hf.py``), so the wall time is what a
user waits for: interpreter start and imports, model and data, training, evaluation and
writing results. Both processes get the same environment (thread settings included), the
same model, data split, hyperparameters and AdaLoRA schedule; the order of the runs
rotates from seed to seed so machine noise lands on all of them. Target: our wall time at
most 0.6x theirs at the same accuracy (within seed noise; issues #32 and #52).

``Trainer`` runs twice by default, and two ratios are printed:

- like for like: ``Trainer`` in the precision our run computes in (``train.precision``
  as this CPU resolves it: bf16 where ``auto`` picks it, else fp32);
- as it comes: ``Trainer`` in its default, fp32 on a CPU.

Where our run is fp32 the two are one and the same ``Trainer`` run. Each row and each
ratio carries the machine's 1-minute load average, sampled while the run ran: a ratio
measured beside other work is not an idle machine's (docs/speed.md).

    python benchmarks/time_to_result.py                          # the demo, seed 0
    python benchmarks/time_to_result.py --seeds 0,1,2            # 3 seeds when time allows
    python benchmarks/time_to_result.py --trainer same           # only like for like
    python benchmarks/time_to_result.py --trainer fp32           # only Trainer's default
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
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEMO = ROOT / "configs" / "demo" / "rotten_tomatoes.yaml"
RUNNERS = {"ours": HERE / "ttr_ours.py", "hf": HERE / "ttr_hf.py"}
LABELS = {"ours": "adalora train", "hf": "HF Trainer + PEFT"}
PHASES = ("load", "train", "evaluate", "other")
TRAINER = ("both", "same", "fp32", "bf16")
"""--trainer: which Trainer runs go beside ours (both: like for like and as it comes)."""


class LoadSampler:
    """The machine's 1-minute load average, sampled every ``every`` seconds (and at both
    ends) while a ``with`` block runs, from a thread that sleeps in between. The kernel
    updates the average every 5 s; ``mean`` is None where the system has no load average."""

    def __init__(self, every: float = 2.0):
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    @staticmethod
    def now() -> float | None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None

    def _sample(self) -> None:
        load = self.now()
        if load is not None:
            self.samples.append(load)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> LoadSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None

    @property
    def peak(self) -> float | None:
        return max(self.samples) if self.samples else None


def load_text(load: float | None) -> str:
    return "n/a" if load is None else f"{load:.2f}"


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


def our_precision(config: Path, overrides: list[str]) -> str:
    """The autocast precision our run of ``config`` computes in on this CPU (fp32 or bf16):
    ``train.precision`` as the runner resolves it, so Trainer can be given the same."""
    sys.path.insert(0, str(ROOT))
    import torch

    from adalora_cli.config import load_config
    from adalora_cli.engine.precision import resolve

    return resolve(load_config(config, overrides).train.precision, torch.device("cpu"))


def trainer_precisions(choice: str, ours: str) -> list[str]:
    """The Trainer precisions ``--trainer choice`` runs beside ours computing in ``ours``."""
    if choice == "both":
        return [ours] if ours == "fp32" else [ours, "fp32"]
    return [ours] if choice == "same" else [choice]


def run_one(runner: str, config: Path, overrides: list[str], env: dict[str, str],
            workdir: Path, hf_bf16: bool = False) -> dict:
    out = workdir / f"{runner}-{time.monotonic_ns()}"
    cmd = [sys.executable, str(RUNNERS[runner]), str(config), str(out), *overrides]
    if runner == "hf":
        env = {**env, "TTR_HF_BF16": "1" if hf_bf16 else "0"}
    with LoadSampler() as load:
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
    result["loadavg"] = load.mean
    return result


def compare(config: Path, overrides: list[str], seeds: list[int],
            env: dict[str, str], hf_precisions: list[str]) -> list[dict]:
    """One run of ours and one of Trainer per precision in ``hf_precisions``, per seed,
    their order rotating from seed to seed."""
    arms = [("ours", False)] + [("hf", p == "bf16") for p in hf_precisions]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ttr-") as tmp:
        for k, seed in enumerate(seeds):
            shift = k % len(arms)
            for runner, bf16 in arms[shift:] + arms[:shift]:
                result = run_one(runner, config, [*overrides, f"train.seed={seed}"], env,
                                 Path(tmp), bf16)
                rows.append({"seed": seed, **result})
    return rows


def _stats(rows: list[dict]) -> dict:
    out = {k: statistics.mean(r[k] for r in rows)
           for k in ("process_wall", *PHASES, "accuracy")}
    accs = [r["accuracy"] for r in rows]
    out["accuracy_std"] = statistics.stdev(accs) if len(accs) > 1 else None
    loads = [r["loadavg"] for r in rows if r.get("loadavg") is not None]
    out["loadavg"] = statistics.mean(loads) if loads else None
    return out


def summarize(rows: list[dict]) -> dict:
    """Means per runner and Trainer precision, and each Trainer precision's ratio; which
    precision is like for like (ours') and which as it comes (Trainer's default, fp32)."""
    ours = [r for r in rows if r["runner"] == "ours"]
    precision = ours[0]["precision"]
    out = {"ours": _stats(ours), "hf": {}, "like_for_like": None, "as_it_comes": None}
    for p in dict.fromkeys(r["precision"] for r in rows if r["runner"] == "hf"):
        out["hf"][p] = _stats([r for r in rows if r["runner"] == "hf" and r["precision"] == p])
        out["hf"][p]["ratio"] = out["ours"]["process_wall"] / out["hf"][p]["process_wall"]
    if precision in out["hf"]:
        out["like_for_like"] = out["hf"][precision]["ratio"]
    if "fp32" in out["hf"]:
        out["as_it_comes"] = out["hf"]["fp32"]["ratio"]
    out["precision"] = precision
    return out


def print_table(rows: list[dict], summary: dict, seeds: list[int], env: dict[str, str]) -> None:
    print(f"time to result, {len(seeds)} seed(s) {seeds}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"  {'runner':18s} {'wall s':>8s} " + " ".join(f"{p:>9s}" for p in PHASES)
          + f" {'accuracy':>9s}  precision  load avg")
    for r in rows:
        print(f"  {LABELS[r['runner']]:18s} {r['process_wall']:8.1f} "
              + " ".join(f"{r[p]:9.1f}" for p in PHASES)
              + f" {100 * r['accuracy']:8.2f}%  {r['precision']:9s} "
              f"{load_text(r.get('loadavg')):>8s}  seed {r['seed']}, {r['steps']} steps")
    ours, mine = summary["ours"], summary["precision"]
    for p, hf in summary["hf"].items():
        if p == mine:
            what = (f"like for like (both {p})" if p != "fp32" else
                    "like for like and as it comes (both fp32, Trainer's default)")
        elif p == "fp32":
            what = f"as it comes (ours {mine}, Trainer fp32, its default)"
        else:
            what = f"Trainer in {p} (ours {mine})"
        spread = (f" (std {100 * ours['accuracy_std']:.2f} / {100 * hf['accuracy_std']:.2f})"
                  if ours["accuracy_std"] is not None else " (one seed: no spread measured)")
        print(f"time-to-result, {what}: ours {ours['process_wall']:.1f} s (load "
              f"{load_text(ours['loadavg'])}) vs HF Trainer + PEFT {hf['process_wall']:.1f} s "
              f"(load {load_text(hf['loadavg'])}), ratio {hf['ratio']:.3f} (target <= 0.6); "
              f"accuracy {100 * ours['accuracy']:.2f} % vs {100 * hf['accuracy']:.2f} %{spread}")


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` as integers; ValueError with the fix for anything else."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be integers like 0,1,2, got {text!r}") from None
    if not seeds:
        raise ValueError("--seeds is empty; give at least one, e.g. --seeds 0")
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEMO)
    parser.add_argument("--seeds", default="0", help="e.g. 0,1,2")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--trainer", choices=TRAINER, default="both",
                        help="Trainer's runs: both (default: in our run's precision, like "
                             "for like, and in its own default fp32, as it comes), same (only "
                             "like for like), fp32 or bf16 (only that one)")
    parser.add_argument("--hf-bf16", action="store_const", const="bf16", dest="trainer",
                        help="the same as --trainer bf16")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runners")
    args = parser.parse_args()
    try:
        seeds = parse_seeds(args.seeds)
        mine = our_precision(args.config, args.overrides)
    except ValueError as e:  # ConfigError is one: a bad config or override, said in a line
        parser.error(str(e))
    env = child_env()  # the wait policy follows the load now, once, for every run
    rows = compare(args.config, args.overrides, seeds, env, trainer_precisions(args.trainer,
                                                                               mine))
    ran = {r["precision"] for r in rows if r["runner"] == "ours"}
    if ran != {mine}:  # Trainer was given the precision ours was expected to run in
        raise SystemExit(f"error: our run computed in {', '.join(sorted(ran))}, not the "
                         f"{mine} its config resolves to here; the like-for-like ratio would "
                         "compare two precisions: set train.precision explicitly")
    summary = summarize(rows)
    print_table(rows, summary, seeds, env)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}))


if __name__ == "__main__":
    main()
