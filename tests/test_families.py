"""Every task family through every command, on its smoke config.

A family is a module of ``adalora_cli.tasks`` (``FAMILIES``); each has a smoke config in
``configs/smoke/`` named after it, and the bundled demo corpora have theirs too
(``bbc_news``: the summarization family on its packaged data), as does ``regression`` (the
classification family on numeric labels). For each:

- in-process (fast): the task is a :class:`~adalora_cli.tasks.base.Task`; the skeleton the
  sweep plans on (meta device, config.json only) is the very module tree the task trains,
  so n is the same; ``predict_rows`` gives every row the family's fields;
- through the CLI (e2e): ``train``, ``train --dry-run``, ``sweep --budget --dry-run``, a
  real 2-run ``sweep`` (AdaLoRA and LoRA at b(T) = n, mean rank 1), ``sweep --status``,
  ``report``, ``export --format peft`` and ``merged`` (of the sweep's AdaLoRA run),
  ``eval`` and ``predict`` (of the trained run). Each works,
  or refuses in one ``error:`` line (exit 2) where the combination has no meaning: a BERT
  warm-started into BART has no base PEFT can rebuild.

A family whose skeleton, prediction or report support goes missing fails here by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import load_config
from adalora_cli.engine.build import resolve_resources
from adalora_cli.engine.skeleton import count_adapted, model_skeleton
from adalora_cli.methods.inject import resolve_targets
from adalora_cli.rundir.summary import read_summary
from adalora_cli.tasks import FAMILIES, get_task
from adalora_cli.tasks.base import Task
from tests.conftest import ROOT, copy_of

SMOKE = ROOT / "configs" / "smoke"
CONFIGS = {path.stem: path for path in sorted(SMOKE.glob("*.yaml"))}
FAMILY_NAMES = sorted(CONFIGS)

PREDICT_INPUT = {
    # rows in each family's columns, and the fields `adalora predict` writes for them
    "glue": ([{"sentence": "the movie was simply dull ."},
              {"sentence": "the plot was truly wonderful ."}], {"label", "scores"}),
    "rotten_tomatoes": ([{"text": "a tedious, joyless film"}, {"text": "a small delight"}],
                        {"label", "scores"}),
    "bbc_topic": ([{"text": "Shares in the bank fell sharply on Monday."},
                   {"text": "The striker scored twice in the cup final."}], {"label", "scores"}),
    "classification": ([{"text": "i was charged twice for my order ."},
                        {"text": "the app stopped working after the update ."}],
                       {"label", "scores"}),
    "regression": ([{"sentence1": "the cat sat on a red chair",
                     "sentence2": "a red chair near the window"},
                    {"sentence1": "the river by the old bridge",
                     "sentence2": "people walked to the quiet city"}], {"score"}),
    "squad": ([{"question": "where did the cat sit ?",
                "context": "the quiet cat sat near the river every night ."},
               {"question": "when was the horse born ?",
                "context": "the white horse was born in tokyo in 1832 ."}], {"answer"}),
    "summarization": ([{"document": "The city council in York has agreed to fund a youth "
                                    "club. Officials said work would begin in May."},
                       {"document": "Residents have largely welcomed the decision."}],
                      {"summary"}),
    "bbc_news": ([{"document": "The company said profits rose by a third in the year.\n"
                               "Its shares rose on the news."},
                  {"document": "The band will tour Europe next spring."}], {"summary"}),
    "causal_lm": ([{"prompt": "Question: Which river runs through Morden?\nAnswer:"},
                   {"prompt": "Question: Is Morden a town or a city?\nAnswer:"}],
                  {"response"}),
    "bbc_topic_chat": ([{"text": "Shares in the bank fell sharply on Monday."},
                        {"text": "The striker scored twice in the cup final."}], {"response"}),
    "gsm8k": ([{"question": "Ada has 3 bags of 4 apples. How many apples?"},
               {"question": "Ben has 5 pens and loses 2. How many are left?"}],
              {"response"}),
}
NO_PEFT_BASE = {"bbc_news"}
"""Families whose run PEFT cannot rebuild: the warm-started BART has no checkpoint of its own."""
QUICK = ["train.max_steps=4", "adalora.t_init=1", "adalora.t_final=2", "adalora.delta_t=1",
         "train.eval_every=null", "task.max_eval_samples=4"]
"""The sweep's runs: a schedule that prunes within 4 steps."""


def invoke(*args: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return CliRunner().invoke(app, [str(a) for a in args])


def ok(result, what: str) -> str:
    assert result.exit_code == 0, f"{what}: exit {result.exit_code}\n{result.output}"
    return result.output


def config(family: str):
    return resolve_resources(load_config(CONFIGS[family]))


def test_every_family_has_a_smoke_config_and_is_a_task():
    modules = {target.split(":")[0] for target in FAMILIES}
    assert modules <= set(CONFIGS), f"families without configs/smoke/<family>.yaml: " \
                                     f"{sorted(modules - set(CONFIGS))}"
    assert set(CONFIGS) == set(PREDICT_INPUT)  # a new smoke config names its predict rows
    for family in FAMILY_NAMES:
        assert isinstance(get_task(config(family)), Task), family


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_task_plans_builds_and_predicts(family):
    """The skeleton (what the sweep counts n on) is the model the task trains, module for
    module; predict_rows fills the family's fields for every row."""
    cfg = config(family)
    task = get_task(cfg)
    skeleton = model_skeleton(cfg)
    model, tokenizer = task.build_model()
    assert type(skeleton) is type(model), family
    assert [n for n, _ in skeleton.named_modules()] == [n for n, _ in model.named_modules()]
    assert count_adapted(cfg) == len(resolve_targets(model, cfg.method.target_modules)) > 0
    task.predict_columns(list(PREDICT_INPUT[family][0][0]), "--input rows.jsonl")
    import datasets

    rows, fields = PREDICT_INPUT[family]
    task.tokenizer = tokenizer
    if tokenizer.pad_token_id is None:  # causal_lm pads with EOS, as its load_data does
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    out = task.predict_rows(model, tokenizer, datasets.Dataset.from_list(rows),
                            torch.device("cpu"))
    assert len(out) == len(rows) and all(set(o) == fields for o in out), out


@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_command(family, smoke_runs, tmp_path):
    source = CONFIGS[family]
    # train (the session's shared run of this config) and its dry run
    run = smoke_runs(str(source.relative_to(ROOT)))
    summary = read_summary(run)
    assert summary.metrics and summary.report is not None, family
    dry = ok(invoke("train", source, "--dry-run"), "train --dry-run")
    n = json.loads(dry.strip().splitlines()[-1])["n_matrices"]
    assert n == summary.n_matrices == count_adapted(config(family))

    # a sweep at b(T) = n (mean final rank 1): planned, run, its status, its report
    sweep = tmp_path / "sweep"
    grid = ("sweep", source, *QUICK, "--budget", str(n), "--methods", "adalora,lora",
            "--seeds", "0", "--sweep-dir", sweep)
    plan = ok(invoke(*grid, "--dry-run"), "sweep --dry-run")
    assert "2 runs planned, 2 would run" in plan
    ok(invoke(*grid, "--jobs", "2", "--quiet"), "sweep")
    status = ok(invoke(*grid, "--status"), "sweep --status")
    assert "2 runs: 2 finished" in status
    report = ok(invoke("report", sweep, "--format", "markdown"), "report")
    check_best(report, family)

    # export the sweep's AdaLoRA run: PEFT where PEFT can rebuild the base, merged always
    swept = sweep / f"{source.stem}-adalora-b{n}-s0"
    assert read_summary(swept).final_budget == n  # b(T) = n: mean final rank 1
    peft = invoke("export", swept, tmp_path / "peft", "--format", "peft")
    if family in NO_PEFT_BASE:
        assert peft.exit_code == 2 and one_error_line(peft).endswith("use --format merged")
        assert not (tmp_path / "peft").exists()
    else:
        ok(peft, "export --format peft")
        written = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
        assert Path(written["base_model_name_or_path"]).is_absolute()  # a local base
        assert written["peft_type"] == "ADALORA" and written["target_r"] == 1
    ok(invoke("export", swept, tmp_path / "merged", "--format", "merged"), "export merged")
    assert (tmp_path / "merged" / "config.json").is_file()

    # eval (writes into the run: on a copy) scores what training scored
    mine = copy_of(run, tmp_path / "run")
    ok(invoke("eval", mine, "--quiet"), "eval")
    again = json.loads((mine / "eval" / "default.json").read_text())["metrics"]
    assert {s: set(m) for s, m in again.items()} == \
        {s: set(m) for s, m in summary.metrics.items()}

    # predict: one line per row, with the family's fields
    rows, fields = PREDICT_INPUT[family]
    table = tmp_path / "rows.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok(invoke("predict", run, "--input", table, "--output", tmp_path / "out.jsonl", "-q"),
       "predict")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["id"] for o in out] == [0, 1] and all(set(o) == {"id"} | fields for o in out)


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def check_best(markdown: str, family: str) -> None:
    """Both methods are rows; in each metric column the bold mean is the best one: the
    lowest for a loss, a perplexity or a mean squared error (marked ↓), the highest
    otherwise."""
    text = markdown.splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("| Method"))
    lines = []
    for line in text[start:]:  # the first table: the results, not the comparison or cost
        if not line.startswith("|"):
            break
        lines.append(line)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]
            if line.startswith(("| AdaLoRA", "| LoRA"))]
    assert sorted(r[0].split()[0] for r in rows) == ["AdaLoRA", "LoRA"], markdown
    first = header.index("b(T)") + 1
    for i, name in enumerate(header[first:], start=first):
        cells = [r[i] for r in rows]
        means = [float(re.search(r"-?\d+\.\d+", c).group()) for c in cells]
        bold = [c.startswith("**") for c in cells]
        best = min(means) if name.endswith("↓") else max(means)
        # the report bolds by the full value: of means equal as printed, either may be bold
        assert any(bold) and all(m == best for m, b in zip(means, bold) if b), \
            (family, name, cells)
    if family == "causal_lm":  # the quality bar: loss bolded at its lowest
        assert any(h.endswith("loss ↓") for h in header), header
