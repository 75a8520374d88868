"""How each task shows in ``adalora report``: its title, its paper table and its columns.

Declared here, beside the task families, so a new task shows correctly with no report edit;
every finished run records its task's columns in ``summary.json``. Torch-free (the report
reads it). GLUE metrics are stored as fractions and shown x100 like the paper; SQuAD and
ROUGE are stored x100 already. A task with no entry shows every metric of its first
evaluation split, in the "other" table.
"""

from __future__ import annotations

from ..rundir.summary import ReportColumn, TaskReport

VAL = ("validation",)
FRACTIONS = {"accuracy", "f1", "matthews", "pearson", "spearman", "corr"}
"""Metrics stored as fractions: shown x100 in an undeclared task's columns."""


def _cols(*specs: tuple[str, tuple[str, ...], str, float]) -> tuple[ReportColumn, ...]:
    return tuple(ReportColumn(*s) for s in specs)


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
    # the LLM demo: generated replies, scored x100 already
    "bbc_topic_chat": TaskReport("BBC topics (chat)", "other", _cols(
        ("EM", VAL, "exact_match", 1), ("R-L", VAL, "rougeL", 1))),
}
"""Task name -> its report; order = the paper's column order."""


def task_report(task: str, metrics: dict) -> TaskReport:
    """The declared report of ``task``, or, for a task without one, every metric of its
    first evaluation split (``metrics``: {split: {name: value}})."""
    if task in REPORTS:
        return REPORTS[task]
    split = "validation" if "validation" in metrics else next(iter(metrics), "")
    found = metrics.get(split) or {}
    return TaskReport(task, "other", tuple(
        ReportColumn(m, (split,), m, 100 if m in FRACTIONS else 1) for m in found))
