"""Every command's help: one notation for what it takes (capitals, no ``<bool>``), examples
that the parser accepts, a ``Docs:`` page that exists; ``predict --help`` says what each
task family reads and writes, ``eval --help`` which overrides it takes. And tables written
off a terminal keep their rows whole."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from adalora_cli.cli import app
from tests.conftest import ROOT
from tests.test_docs_commands import anchors

runner = CliRunner()


def command_paths(command=None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the app, as the words that call it: (), ("train",), ...,
    ("configs",), ("configs", "cp")."""
    command = command or typer.main.get_command(app)
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        found += command_paths(sub, (*path, name))
    return found


PATHS = command_paths()
IDS = [" ".join(p) or "adalora" for p in PATHS]


def help_text(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], prog_name="adalora")
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_walked():
    assert {"train", "sweep", "report", "export", "eval", "predict", "configs"} <= {
        p[0] for p in PATHS if p}
    assert ("configs", "cp") in PATHS and ("configs", "ls") in PATHS


# typer's own notation, which the help no longer uses: <bool>, <str>, <path>, <list[str]> ...
TYPER_TYPE = re.compile(r"<(?:bool|str|int|float|path|file|dir|list\[[^\]]*\])>")


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_one_notation(path):
    text = help_text(path)
    assert TYPER_TYPE.findall(text) == []
    (usage,) = re.findall(r"Usage: adalora(.*)", text)
    words = usage.split()[len(path):]
    assert words[0] == "[OPTIONS]", usage
    # arguments in capitals, optional ones in brackets, never typer's {run_dir}
    assert all(w == w.upper() and "{" not in w for w in words), usage
    if path == ("train",):
        assert words == ["[OPTIONS]", "[CONFIG]", "[KEY=VALUE]..."]
        assert re.search(r"--dry-run +Build model", text)  # a flag shows no value
        assert re.search(r"--resume +RUN_DIR +Continue", text)


def examples(text: str) -> list[str]:
    """The command lines under ``Examples:``, each cut at a pipe (``| grep glue``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    found = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        found.append(line.split("|")[0].strip())
    return found


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_examples_parse_and_the_page_exists(path, in_repo):
    text = help_text(path)
    lines = examples(text)
    assert lines and all(line.startswith("adalora ") for line in lines), lines
    for line in lines:
        result = runner.invoke(app, [*shlex.split(line)[1:], "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, (line, result.output)
    (page,) = re.findall(r"Docs: (\S+?);?(?:\s|$)", text)
    file, _, anchor = page.partition("#")
    assert (ROOT / file).is_file(), page
    assert not anchor or anchor in anchors(ROOT / file), page


def test_a_wrong_example_fails_the_check(in_repo):
    # the parse above is a real check: a renamed option is refused
    assert runner.invoke(app, ["train", "x.yaml", "--dryrun", "--help"]).exit_code == 2


def _family_rows(text: str) -> dict[str, str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["family", "reads",
                                                                         "writes"])
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        family, rest = line.split(maxsplit=1)
        rows[family] = rest.strip()
    return rows


def test_predict_help_says_what_each_family_reads_and_writes():
    from tests.test_families import PREDICT_INPUT

    rows = _family_rows(help_text(("predict",)))
    assert set(rows) == {"classification", "regression", "squad", "summarization",
                         "causal_lm"}
    assert rows["causal_lm"].split() == ["prompt,", "text", "or", "a", "chat", "response"]
    assert rows["squad"].split() == ["question,", "context", "answer"]
    assert rows["classification"].endswith("label, scores")
    assert rows["regression"].endswith(" score")
    table = " ".join(rows.values())
    # what the families really write, and the fixed columns some read (tests/test_families.py
    # runs them); the classification families read columns their config names
    for family, (inputs, fields) in PREDICT_INPUT.items():
        assert [f for f in fields if f not in table] == [], family
        if family in ("glue", "squad", "summarization", "causal_lm"):
            assert [c for c in inputs[0] if c not in table] == [], family


def test_eval_help_lists_the_overrides_it_takes():
    from adalora_cli.artifacts.rescore import ALLOWED

    text = " ".join(help_text(("eval",)).split())
    named = [key + "*" if key.endswith(".") else key for key in ALLOWED]
    assert [key for key in named if key not in text] == []
    assert "(task.name, task.max_train_samples) are refused" in text


# ---------------------------------------------------------------------------- wide tables
# CliRunner's output and pytest's captured stdout are not terminals, like a pipe or a file:
# there rich laid tables out in 80 columns, folding run names and cells over two lines.

def test_a_report_into_a_pipe_keeps_each_row_on_one_line(tmp_path):
    from tests.report.test_report import glue_metrics, make_run

    for i, task in enumerate(["mnli", "sst2", "cola", "qqp", "qnli", "rte", "mrpc", "stsb"]):
        make_run(tmp_path, f"{task}-adalora-s0", task, "adalora", 0,
                 glue_metrics(task, 0.80 + i / 100), 576)
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if "AdaLoRA" in line and "(1)" in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    # by hand from glue_metrics: MNLI m/mm 80/81, SST-2 81, CoLA 82, QQP 83/81, QNLI 84,
    # RTE 85, MRPC 86, STS-B (0.87 + 0.89) / 2; All Ave. 668.5 / 8 = 83.5625
    assert cells == ["AdaLoRA", "1.00K", "576", *[f"{v}.00 (1)" for v in
                     (80, 81, 81, 82, 83, 81, 84, 85, 86, 88)], "83.56"]


def test_a_status_table_into_a_pipe_keeps_run_names_whole(capsys):
    from adalora_cli.cli.boundary import out
    from adalora_cli.sweep.show import print_status
    from adalora_cli.sweep.status import RunStatus

    name = "cnn_dailymail-adalora-b1536-s2-lr5e-4-warmup3000-beams4"
    detail = "RuntimeError: CUDA out of memory while generating the validation summaries"
    print_status([RunStatus(name, "failed", detail), RunStatus("rte-lora-b144-s0", "finished")],
                 Path("runs/table3"), out())
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if name in line and detail in line and "failed" in line]
    assert [line for line in lines if "rte-lora-b144-s0" in line and "finished" in line]
