"""The paper's published numbers (Tables 1, 2, 3 and 9), for showing beside ours.

Keys are (method, budget level), the level being AdaLoRA's final budget b(T) of docs/maths.md
#budget-levels on the paper's model: DeBERTaV3-base (n = 72) for Tables 1, 2 and 9, BART-large
(n = 192) for Table 3, whose 0.13 / 0.26 / 1.10 / 2.20 % rows are rbar = 1 / 2 / 8 / 16.
Methods without a size (full, BitFit) have level None. Values are as printed (x100);
columns use the report's ``task:metric`` keys. The text is copied from the LaTeX source
(paper/adalora-iclr2023.tex), one row per line, so it can be checked against it by eye.
"""

from __future__ import annotations

ALL_AVE = "All Ave."

_TABLE1_COLUMNS = ["mnli:m", "mnli:mm", "sst2:Acc", "cola:Mcc", "qqp:Acc", "qqp:F1", "qnli:Acc",
                   "rte:Acc", "mrpc:Acc", "stsb:Corr", ALL_AVE]
# method  level  # Params  MNLI m/mm  SST-2  CoLA  QQP acc/F1  QNLI  RTE  MRPC  STS-B  All Ave.
_TABLE1 = """
full     -    184M   89.90 90.12 95.63 69.19 92.40 89.80 94.03 83.75 89.46 91.60 88.09
bitfit   -    0.1M   89.37 89.91 94.84 66.96 88.41 84.95 92.24 78.70 87.75 91.35 86.02
houlsby  576  1.22M  90.13 90.17 95.53 68.64 91.91 89.27 94.11 84.48 89.95 91.48 88.12
pfeiffer 576  1.18M  90.33 90.39 95.61 68.77 92.04 89.40 94.29 85.20 89.46 91.54 88.24
lora     576  1.33M  90.65 90.69 94.95 69.82 91.99 89.38 93.87 85.20 89.95 91.60 88.34
adalora  576  1.27M  90.76 90.79 96.10 71.45 92.23 89.74 94.55 88.09 90.69 91.84 89.31
houlsby  288  0.61M  90.12 90.23 95.30 67.87 91.65 88.95 93.76 85.56 89.22 91.30 87.93
pfeiffer 288  0.60M  90.15 90.28 95.53 69.48 91.62 88.86 93.98 84.12 89.22 91.52 88.04
houlsby  144  0.31M  90.10 90.02 95.41 67.65 91.54 88.81 93.52 83.39 89.25 91.31 87.60
pfeiffer 144  0.30M  89.89 90.06 94.72 69.06 91.40 88.62 93.87 84.48 89.71 91.38 87.90
lora     144  0.33M  90.30 90.38 94.95 68.71 91.61 88.91 94.03 85.56 89.71 91.68 88.15
adalora  144  0.32M  90.66 90.70 95.80 70.04 91.78 89.16 94.49 87.36 90.44 91.63 88.86
"""

_TABLE2_COLUMNS = ["squad_v1:EM", "squad_v1:F1", "squad_v2:EM", "squad_v2:F1"]
# method  level  # Params  SQuADv1.1 EM/F1  SQuADv2.0 EM/F1
_TABLE2 = """
full     -    100%   86.0 92.7 85.4 88.4
houlsby  72   0.08%  84.4 91.5 83.4 86.6
houlsby  144  0.16%  85.3 92.1 84.3 87.3
houlsby  288  0.32%  86.1 92.7 84.9 87.9
houlsby  576  0.65%  86.7 92.9 85.4 88.3
pfeiffer 72   0.08%  84.4 91.7 84.2 87.2
pfeiffer 144  0.16%  85.9 92.5 84.5 87.6
pfeiffer 288  0.32%  86.2 92.8 84.9 87.8
pfeiffer 576  0.65%  86.6 93.0 84.5 87.5
lora     72   0.08%  86.4 92.8 84.7 87.5
lora     144  0.16%  86.6 92.9 83.6 86.7
lora     288  0.32%  86.7 93.1 84.5 87.4
lora     576  0.65%  86.7 93.1 85.0 88.0
adalora  72   0.08%  87.2 93.4 85.6 88.7
adalora  144  0.16%  87.5 93.6 85.7 88.8
adalora  288  0.32%  87.5 93.7 85.5 88.6
adalora  576  0.65%  87.6 93.7 86.0 88.9
"""

_TABLE3_COLUMNS = ["xsum:R-1", "xsum:R-2", "xsum:R-L",
                   "cnn_dailymail:R-1", "cnn_dailymail:R-2", "cnn_dailymail:R-L"]
# method  level  # Params  XSum R-1/2/L  CNN/DailyMail R-1/2/L
_TABLE3 = """
full     -     100%   45.49 22.33 37.26 44.16 21.28 40.90
lora     3072  2.20%  43.95 20.72 35.68 45.03 21.84 42.15
adalora  3072  2.20%  44.72 21.46 36.46 45.00 21.89 42.16
lora     1536  1.10%  43.40 20.20 35.20 44.72 21.58 41.84
adalora  1536  1.10%  44.35 21.13 36.13 44.96 21.77 42.09
lora     384   0.26%  43.18 19.89 34.92 43.95 20.91 40.98
adalora  384   0.26%  43.55 20.17 35.20 44.39 21.28 41.50
lora     192   0.13%  42.81 19.68 34.73 43.68 20.63 40.71
adalora  192   0.13%  43.29 19.95 35.04 43.94 20.83 40.96
"""

# Table 9 (V100): task  level  method  GPU memory (GB)  minutes per epoch
_TABLE9 = """
mnli  72   lora     11.094 105
mnli  72   adalora  11.104 116
mnli  144  lora     11.098 105
mnli  144  adalora  11.110 117
mnli  576  lora     11.128 105
mnli  576  adalora  11.188 117
sst2  72   lora     13.138 60
sst2  72   adalora  13.148 71
sst2  144  lora     13.142 61
sst2  144  adalora  13.164 71
sst2  576  lora     13.170 61
sst2  576  adalora  13.226 71
"""

Key = tuple[str, "int | None"]


def _parse(text: str, columns: list[str]) -> dict[Key, dict[str, float]]:
    rows = {}
    for line in text.strip().splitlines():
        method, level, _params, *values = line.split()
        assert len(values) == len(columns), line  # a copying slip fails at import
        key = (method, None if level == "-" else int(level))
        rows[key] = dict(zip(columns, map(float, values)))
    return rows


TABLES = {
    "Table 1 (GLUE, DeBERTaV3-base)": _parse(_TABLE1, _TABLE1_COLUMNS),
    "Table 2 (SQuAD, DeBERTaV3-base)": _parse(_TABLE2, _TABLE2_COLUMNS),
    "Table 3 (summarization, BART-large)": _parse(_TABLE3, _TABLE3_COLUMNS),
}

TRAINING_COST = {
    (task, int(level), method): (float(gb), float(minutes))
    for task, level, method, gb, minutes in (line.split() for line in _TABLE9.strip().splitlines())
}
"""(task, budget level, method) -> (GPU memory in GB, minutes per epoch), Table 9."""


def published(column: str, method: str, level: int | None) -> float | None:
    """The paper's value for ``column`` (e.g. 'mnli:m', 'All Ave.'), or None."""
    for rows in TABLES.values():
        value = rows.get((method, level), {}).get(column)
        if value is not None:
            return value
    return None
