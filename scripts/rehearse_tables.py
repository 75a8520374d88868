"""Rehearse docs/reproducing.md on a CPU machine without internet: every command a GPU user
runs for paper Tables 1-3, in order, against the local hub (tests/fixtures/hub), which
serves tiny stand-ins under the real model and dataset ids.

The commands are the documented ones, with three changes that keep them to minutes on a
CPU: the sweeps run one seed (``--seeds 0``) two at a time (``--jobs 2``), and every run is
cut to a few steps on a few dozen rows by the overrides below (the sweep applies them to
every run). What cannot run here is the download from huggingface.co and CUDA. Run from the
repository root::

    .venv/bin/python scripts/rehearse_tables.py                   # Tables 1, 2 and 3
    .venv/bin/python scripts/rehearse_tables.py --tables 3 --out /tmp/rehearsal
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.hub.build import ensure_built  # noqa: E402
from tests.fixtures.hub.server import HubServer  # noqa: E402

SHORT = ["train.max_steps=4", "train.warmup_steps=1", "adalora.t_init=1", "adalora.delta_t=1",
         "adalora.t_final=1", "train.eval_every=4", "train.batch_size=4",
         "train.eval_batch_size=8", "task.max_train_samples=16", "task.max_eval_samples=8"]
TABLES = {  # table: (one config, its manifest, the report folder, size overrides)
    "1": ("configs/glue/rte.yaml", "table1_glue", "table1", ["task.max_length=64"]),
    "2": ("configs/squad/squad_v1.yaml", "table2_squad", "table2",
          ["task.max_length=96", "task.doc_stride=32"]),
    "3": ("configs/summarization/xsum.yaml", "table3_summarization", "table3",
          ["task.max_length=64", "task.max_target_length=16",
           "task.generation_min_length=4"]),
}


def commands(table: str, out: Path) -> list[list[str]]:
    config, manifest, report, sizes = TABLES[table]
    sweep = ["adalora", "sweep", f"experiments/{manifest}.yaml"]
    runs = str(out / "runs" / manifest)
    return [["adalora", "train", config, "--dry-run"],
            [*sweep, "--dry-run"],
            [*sweep, "--jobs", "2", "--seeds", "0", "--sweep-dir", runs, "--quiet",
             *SHORT, *sizes],
            ["adalora", "report", runs, "--paper", "--format", "markdown", "--out",
             str(out / "report" / report)]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="1,2,3")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    adalora = str(Path(sys.executable).parent / "adalora")
    failed = 0
    with HubServer(ensure_built()) as hub:
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(out / "hf-home"))
        print(f"local hub on {hub.url}; everything under {out}", flush=True)
        for table in args.tables.split(","):
            for command in commands(table, out):
                start = time.perf_counter()
                done = subprocess.run([adalora, *command[1:]], cwd=ROOT, env=env,
                                      capture_output=True, text=True)
                took = time.perf_counter() - start
                print(f"[table {table}] {shlex.join(command)}: exit {done.returncode}, "
                      f"{took:.0f}s", flush=True)
                log = out / "logs" / f"table{table}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("a") as handle:
                    handle.write(f"$ {shlex.join(command)}\n{done.stdout}{done.stderr}\n")
                if done.returncode != 0:
                    failed += 1
                    print(done.stderr[-2000:], file=sys.stderr)
    print("all commands succeeded" if not failed else f"{failed} command(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
