"""OpenMP's wait policy on the demo: ``ACTIVE`` against ``PASSIVE``, on an idle machine and
beside other work, as ``adalora train`` runs it (a fresh process per run).

Why ``adalora`` picks the policy from the load when it starts (adalora_cli/threads.py):
spinning threads win when the cores are ours, and lose badly when another process wants
them. ``--busy K`` starts K processes that each keep one core busy for the whole of those
runs (the "busy" rows), as other users' work would. The two policies alternate order from
round to round so the VM's drift lands on both.

    python benchmarks/wait_policy.py                       # 40 steps, 1 round, busy 1
    python benchmarks/wait_policy.py --steps 60 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo" / "rotten_tomatoes.yaml"
POLICIES = ("ACTIVE", "PASSIVE")


def spin() -> None:  # one core's worth of someone else's work
    while True:
        pass


def run_once(policy: str, steps: int, workdir: Path) -> dict:
    out = workdir / f"{policy}-{time.monotonic_ns()}"
    # a short schedule of the demo's own: warm-up, then pruning, within the steps
    cmd = [sys.executable, "-m", "adalora_cli", "train", str(DEMO), f"train.max_steps={steps}",
           f"train.warmup_steps={steps // 4}", f"adalora.t_init={steps // 4}",
           f"adalora.t_final={steps // 2}", "--run-dir", str(out), "--quiet"]
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the {policy} run failed (exit {done.returncode}): {tail}")
    summary = json.loads((out / "summary.json").read_text())
    return {"policy": policy, "wall": wall, "train": summary["train_seconds"]}


def measure(steps: int, rounds: int, busy: int, workdir: Path) -> list[dict]:
    rows = []
    for machine, hogs in (("idle", 0), (f"busy {busy}", busy)):
        if machine != "idle" and busy == 0:
            continue
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(hogs)]
        for p in spinners:
            p.start()
        try:
            for k in range(rounds):
                for policy in (POLICIES if k % 2 == 0 else POLICIES[::-1]):
                    row = {"machine": machine, **run_once(policy, steps, workdir),
                           "load": os.getloadavg()[0]}
                    rows.append(row)
                    print(f"  {machine:7s} {policy:8s} wall {row['wall']:7.1f} s   train "
                          f"{row['train']:7.1f} s   load {row['load']:.2f}", flush=True)
        finally:
            for p in spinners:
                p.terminate()
                p.join()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--busy", type=int, default=1,
                        help="processes keeping one core each busy for the busy rows (0: none)")
    args = parser.parse_args()
    if args.steps < 8 or args.rounds < 1 or args.busy < 0:
        raise SystemExit("error: --steps must be at least 8, --rounds at least 1 and --busy "
                         "at least 0")
    print(f"wait policy, the demo's first {args.steps} steps, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    with tempfile.TemporaryDirectory(prefix="wait-policy-") as tmp:
        rows = measure(args.steps, args.rounds, args.busy, Path(tmp))
    for machine in dict.fromkeys(r["machine"] for r in rows):
        train = {p: statistics.mean(r["train"] for r in rows
                                    if r["machine"] == machine and r["policy"] == p)
                 for p in POLICIES}
        ratio = train["ACTIVE"] / train["PASSIVE"]
        print(f"{machine}: training ACTIVE {train['ACTIVE']:.1f} s, PASSIVE "
              f"{train['PASSIVE']:.1f} s, ACTIVE / PASSIVE {ratio:.3f}")


if __name__ == "__main__":
    main()
