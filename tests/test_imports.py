"""Start-up cost: ``adalora --help`` loads no ML library, and a GLUE run loads no other
task family's stack (SQuAD, BART warm start, ROUGE) and no scikit-learn, checked on
``sys.modules`` of a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adalora_cli import tasks
from tests.conftest import ROOT

HEAVY_FOR_GLUE = ["adalora_cli.tasks.squad", "adalora_cli.tasks.summarization",
                  "adalora_cli.tasks.warm_start", "adalora_cli.tasks.rouge", "rouge_score",
                  "nltk", "sklearn", "transformers.models.bart.modeling_bart"]


def modules_after(code: str) -> set[str]:
    """Top-level and task modules loaded by ``code`` run in a fresh interpreter."""
    probe = (f"{code}\nimport json, sys\n"
             "print('MODULES=' + json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**_env(), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES="))
    return set(json.loads(line[len("MODULES="):]))


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.mark.e2e
def test_help_loads_no_ml_library():
    code = ("import sys\nfrom adalora_cli.cli import app\nsys.argv = ['adalora', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass")
    loaded = modules_after(code)
    assert "adalora_cli.cli" in loaded
    for name in ("torch", "transformers", "datasets", "scipy", "sklearn", "pandas",
                 "matplotlib", "adalora_cli.tasks"):
        assert name not in loaded, name


@pytest.mark.e2e
def test_glue_run_loads_only_its_own_family(tmp_path):
    code = ("import sys\nfrom adalora_cli.cli import app\n"
            "sys.argv = ['adalora', 'train', 'configs/smoke/glue.yaml', '--run-dir', "
            f"{str(tmp_path / 'run')!r}, '-q']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code")
    loaded = modules_after(code)
    assert (tmp_path / "run" / "summary.json").is_file()  # the run really happened
    assert {"adalora_cli.tasks.glue", "torch", "transformers"} <= loaded
    assert [m for m in HEAVY_FOR_GLUE if m in loaded] == []


def test_registry_names_match_each_family_spec_table():
    from adalora_cli.tasks.glue import GLUE_SPECS
    from adalora_cli.tasks.squad import SQUAD_SPECS
    from adalora_cli.tasks.summarization import SUMMARIZATION_SPECS

    families = {target: set(names) for target, names in tasks.FAMILIES.items()}
    assert families == {"glue:glue_task": set(GLUE_SPECS),
                        "rotten_tomatoes:rotten_tomatoes_task": {"rotten_tomatoes"},
                        "bbc_topic:bbc_topic_task": {"bbc_topic"},
                        "classification:classification_task": {"classification"},
                        "squad:squad_task": set(SQUAD_SPECS),
                        "summarization:summarization_task": set(SUMMARIZATION_SPECS),
                        "causal_lm:causal_lm_task": {"causal_lm"},
                        "bbc_topic_chat:bbc_topic_chat_task": {"bbc_topic_chat"},
                        "gsm8k:gsm8k_metamath_task": {"gsm8k_metamath"}}
    assert len(tasks.TASKS) == sum(map(len, families.values()))
