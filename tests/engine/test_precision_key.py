"""``train.precision`` is decided once: engine/precision.py reads it (:func:`decide`, and
``requested`` for eval's override) and every other module reads the record the build keeps
on ``Built.precision``. Followed through a whole run, the key is read exactly once."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "adalora_cli"
RESOLVER = PACKAGE / "engine" / "precision.py"


def reads_of_the_key(path: Path) -> list[int]:
    """Lines of ``path`` that read ``<...>.train.precision`` or a ``train``/``t_cfg``
    TrainConfig's ``.precision``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "precision":
            owner = node.value
            if (isinstance(owner, ast.Attribute) and owner.attr == "train") or (
                    isinstance(owner, ast.Name) and owner.id in ("train", "t_cfg")):
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_resolver_reads_train_precision():
    found = {str(p.relative_to(ROOT)): reads_of_the_key(p)
             for p in sorted(PACKAGE.rglob("*.py")) if p != RESOLVER}
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert reads_of_the_key(RESOLVER)  # the check itself sees the resolver's reads


def test_a_run_reads_train_precision_once(monkeypatch, tmp_path, in_repo):
    """Every read of the key during a smoke run (header, build, step, loop, summary) is
    recorded with the function that made it: one, :func:`decide`'s, besides the dataclass
    machinery that writes the config out."""
    from adalora_cli.config import TrainConfig, load_config
    from adalora_cli.engine.loop import train

    from .conftest import SMOKE

    readers: Counter = Counter()

    def read(self):
        caller = sys._getframe(1)
        readers[caller.f_globals.get("__name__"), caller.f_code.co_name] += 1
        return self.__dict__["precision"]

    def write(self, value):  # the frozen dataclass's __init__ sets it through here
        self.__dict__["precision"] = value

    cfg = load_config(SMOKE, ["train.max_steps=14", "train.precision=fp32"])
    monkeypatch.setattr(TrainConfig, "precision", property(read, write), raising=False)
    run = train(cfg, tmp_path / "run", quiet=False)
    assert (run / "summary.json").is_file()
    ours = {who: n for who, n in readers.items() if who[0].startswith("adalora_cli")}
    assert ours == {("adalora_cli.engine.precision", "decide"): 1}


def test_the_step_stands_below_the_build():
    """``engine.step.Stepper`` (the loop's step, which the benchmarks time on their own)
    reaches none of the build stack, not engine.build nor the tasks and loaders above it:
    it takes the build's decision (engine.precision's record) as an argument instead."""
    from tests.test_layers import graph, unit

    g = graph()
    reached, todo = set(), ["adalora_cli.engine.step"]
    while todo:
        for nxt in g.get(todo.pop(), ()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert "adalora_cli.engine.precision" in reached
    assert "adalora_cli.engine.build" not in reached
    assert not {m for m in reached if unit(m) == "tasks"}, sorted(reached)
