"""A model that does not load is one error with one hint, whichever loader met it: the build's
(engine/build.py ``load_model``) and the task families that catch their own loading errors
(GLUE's and SQuAD's ``build_model``). The hub's refusals are raised where the hub client
would raise them (``hf_hub_download``), so transformers wraps them as it does for real: a
gated repo as an OSError caused by ``GatedRepoError``."""

from __future__ import annotations

import httpx2
import pytest
import transformers.utils.hub as transformers_hub
from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

from adalora_cli.config import ConfigError, load_config
from adalora_cli.engine.build import load_model, resolve_resources
from adalora_cli.tasks import get_task

REPO = "meta-llama/Llama-3.2-1B"
GATED = (f"could not load model {REPO!r}: it is a gated repo (You are trying to access a "
         f"gated repo.); accept its licence on https://huggingface.co/{REPO}, then log in "
         "with `hf auth login` or set HF_TOKEN to a token of that account")
MISSING = (f"could not load model {REPO!r} ({REPO} is not a local folder and is not a valid "
           "model identifier listed on 'https://huggingface.co/models'); set "
           "model.name_or_path to a local folder or check the network")
SMOKE = ["configs/smoke/glue.yaml", "configs/smoke/squad.yaml",
         "configs/smoke/summarization.yaml"]


def refusing(kind: type[Exception]):
    """``hf_hub_download`` answering every file of REPO with the hub's ``kind`` refusal."""
    def download(repo_id, filename, **kwargs):
        url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
        raise kind(f"401 Client Error. Cannot access repo for url {url}.",
                   response=httpx2.Response(401, request=httpx2.Request("GET", url)))
    return download


def task_for(config: str):
    cfg = resolve_resources(load_config(config, [f"model.name_or_path={REPO}"]))
    return get_task(cfg), cfg


@pytest.mark.parametrize("config", SMOKE)
@pytest.mark.parametrize("kind, line", [(GatedRepoError, GATED),
                                        (RepositoryNotFoundError, MISSING)])
def test_the_build_says_one_line_with_one_hint(in_repo, monkeypatch, config, kind, line):
    monkeypatch.setattr(transformers_hub, "hf_hub_download", refusing(kind))
    task, cfg = task_for(config)
    with pytest.raises(ConfigError) as err:
        load_model(task, cfg)
    assert str(err.value) == line


@pytest.mark.parametrize("config", SMOKE[:2])  # GLUE and SQuAD catch their own errors
@pytest.mark.parametrize("kind, line", [(GatedRepoError, GATED),
                                        (RepositoryNotFoundError, MISSING)])
def test_a_task_family_s_own_loader_keeps_the_same_hint(in_repo, monkeypatch, config, kind,
                                                        line):
    """The tokenizer is the first file GLUE and SQuAD load, inside their own ``except``."""
    monkeypatch.setattr(transformers_hub, "hf_hub_download", refusing(kind))
    task, _ = task_for(config)
    with pytest.raises(ConfigError) as err:
        task.build_model()
    assert str(err.value) == line
