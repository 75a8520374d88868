"""How each task shows in ``adalora report``: its title, its paper table, its columns and
which way each is better.

Declared here, beside the task families, so a new task shows correctly with no report edit;
a task hands its entry to the loop (``Task.report``) and every finished run records it in
``summary.json``. Torch-free, so the report can read it too (for summaries written before a
field existed). GLUE metrics are stored as fractions and shown x100 like the paper; SQuAD and
ROUGE are stored x100 already. A task with no entry shows every metric of its first
evaluation split, in the "other" table. Every metric is higher-is-better except a loss, a
perplexity and a mean squared error (:data:`LOWER_IS_BETTER`).
"""

from __future__ import annotations

import dataclasses

from ..rundir.summary import ReportColumn, TaskReport

VAL = ("validation",)
FRACTIONS = {"accuracy", "f1", "macro_f1", "matthews", "pearson", "spearman", "corr"}
"""Metrics stored as fractions: shown x100 in an undeclared task's columns."""
LOWER_IS_BETTER = frozenset({"loss", "perplexity", "mse"})
"""Metrics where less is better, in any task's columns."""


def _cols(*specs: tuple[str, tuple[str, ...], str, float]) -> tuple[ReportColumn, ...]:
    return tuple(ReportColumn(*s, lower_is_better=s[2] in LOWER_IS_BETTER) for s in specs)


_ROUGE = ("test", "validation")
REPORTS: dict[str, TaskReport] = {
    # the paper's column order within each table
    "mnli": TaskReport("MNLI", "glue", _cols(("m", ("validation_matched",), "accuracy", 100),
                                             ("mm", ("validation_mismatched",), "accuracy",
                                              100))),
    "sst2": TaskReport("SST-2", "glue", _cols(("Acc", VAL, "accuracy", 100))),
    "cola": TaskReport("CoLA", "glue", _cols(("Mcc", VAL, "matthews", 100))),
    "qqp": TaskReport("QQP", "glue", _cols(("Acc", VAL, "accuracy", 100),
                                           ("F1", VAL, "f1", 100))),
    "qnli": TaskReport("QNLI", "glue", _cols(("Acc", VAL, "accuracy", 100))),
    "rte": TaskReport("RTE", "glue", _cols(("Acc", VAL, "accuracy", 100))),
    "mrpc": TaskReport("MRPC", "glue", _cols(("Acc", VAL, "accuracy", 100))),
    # STS-B: Corr is the mean of Pearson and Spearman (paper Table 1 footnote)
    "stsb": TaskReport("STS-B", "glue", _cols(("Corr", VAL, "corr", 100))),
    "squad_v1": TaskReport("SQuADv1.1", "squad", _cols(("EM", VAL, "exact_match", 1),
                                                        ("F1", VAL, "f1", 1))),
    "squad_v2": TaskReport("SQuADv2.0", "squad", _cols(("EM", VAL, "exact_match", 1),
                                                        ("F1", VAL, "f1", 1))),
    "xsum": TaskReport("XSum", "summarization", _cols(
        ("R-1", _ROUGE, "rouge1", 1), ("R-2", _ROUGE, "rouge2", 1), ("R-L", _ROUGE, "rougeL", 1))),
    "cnn_dailymail": TaskReport("CNN/DailyMail", "summarization", _cols(
        ("R-1", _ROUGE, "rouge1", 1), ("R-2", _ROUGE, "rouge2", 1), ("R-L", _ROUGE, "rougeL", 1))),
    # your own data: loss and perplexity always; exact match and ROUGE-L when evaluation
    # generates (task.max_new_tokens > 0)
    "causal_lm": TaskReport("causal LM", "other", _cols(
        ("loss", VAL, "loss", 1), ("ppl", VAL, "perplexity", 1), ("EM", VAL, "exact_match", 1),
        ("R-L", VAL, "rougeL", 1))),
    # the LLM demo: generated replies, scored x100 already
    "bbc_topic_chat": TaskReport("BBC topics (chat)", "other", _cols(
        ("EM", VAL, "exact_match", 1), ("R-L", VAL, "rougeL", 1))),
    # PEFT's method comparison: final-answer accuracy on GSM8K test (x100 already)
    "gsm8k_metamath": TaskReport("GSM8K (MetaMathQA)", "other", _cols(
        ("Acc", VAL, "accuracy", 1), ("loss", VAL, "loss", 1))),
}
"""Task name -> its report; order = the paper's column order."""


COUNTS = ("total",)
"""Metric names ending so are counts (SQuAD v2's HasAns_total): printed as integers."""


def metrics_line(metrics: dict[str, float]) -> str:
    """One split's scores as the CLI prints them: ``accuracy 0.4375  f1 0.5000``, counts
    as whole numbers (``HasAns_total 16``)."""
    def shown(name: str, value: float | None) -> str:
        if value is None:  # not a number (e.g. Pearson of a constant), stored as null
            return f"{name} n/a"
        if name.endswith(COUNTS) and float(value).is_integer():
            return f"{name} {int(value)}"
        return f"{name} {value:.4f}"
    return "  ".join(shown(k, v) for k, v in metrics.items())


def with_directions(report: TaskReport) -> TaskReport:
    """``report`` with every column's direction known: a summary written before columns
    recorded one says None, which means lower-is-better only for a loss or a perplexity."""
    if all(c.lower_is_better is not None for c in report.columns):
        return report
    return dataclasses.replace(report, columns=tuple(
        c if c.lower_is_better is not None else
        dataclasses.replace(c, lower_is_better=c.metric in LOWER_IS_BETTER)
        for c in report.columns))


def task_report(task: str, metrics: dict) -> TaskReport:
    """The declared report of ``task``, or, for a task without one, every metric of its
    first evaluation split (``metrics``: {split: {name: value}})."""
    if task in REPORTS:
        return REPORTS[task]
    split = "validation" if "validation" in metrics else next(iter(metrics), "")
    found = metrics.get(split) or {}
    return TaskReport(task, "other", tuple(
        ReportColumn(m, (split,), m, 100 if m in FRACTIONS else 1, m in LOWER_IS_BETTER)
        for m in found))
