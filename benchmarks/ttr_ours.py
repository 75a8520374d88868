"""One time-to-result run through our runner, timed by phase (a child of time_to_result.py).

    python benchmarks/ttr_ours.py CONFIG RUN_DIR [key=value ...]

Prints one JSON line: wall seconds from interpreter start, the phases (load = imports,
model, data and method until the training loop starts; train = the loop; evaluate = the
final evaluation; other = writing the run directory), accuracy and step count.
"""

import time

START = time.perf_counter()  # before any heavy import: imports count as load time

import json  # noqa: E402
import sys  # noqa: E402

from adalora_cli import threads  # noqa: E402

threads.apply_defaults()  # what the CLI does first; a no-op when the parent set them

from adalora_cli.config import load_config  # noqa: E402
from adalora_cli.engine import loop as training  # noqa: E402


def main() -> None:
    config, run_dir, *overrides = sys.argv[1:]
    import datasets
    datasets.disable_progress_bars()
    marks: dict[str, float] = {"evaluate": 0.0}
    loop, evaluate_all = training._loop, training._evaluate

    def timed_loop(*args, **kwargs):
        marks["loop_start"] = time.perf_counter()
        return loop(*args, **kwargs)

    def timed_eval(*args, **kwargs):
        t = time.perf_counter()
        try:
            return evaluate_all(*args, **kwargs)
        finally:
            marks["evaluate"] += time.perf_counter() - t

    training._loop, training._evaluate = timed_loop, timed_eval
    path = training.train(load_config(config, overrides), run_dir, quiet=True)
    wall = time.perf_counter() - START
    summary = json.loads((path / "summary.json").read_text())
    metrics = next(iter(summary["metrics"].values()))
    load = marks["loop_start"] - START
    train = summary["train_seconds"]
    print(json.dumps({
        "runner": "ours", "wall": wall, "load": load, "train": train,
        "evaluate": marks["evaluate"], "other": wall - load - train - marks["evaluate"],
        "accuracy": metrics["accuracy"], "steps": summary["total_steps"],
        "train_examples": summary["data"]["train_examples"],
        "eval_examples": summary["data"]["validation_examples"],
        "final_budget": summary.get("final_budget"),
        "precision": summary["precision"]["autocast"]}))


if __name__ == "__main__":
    main()
