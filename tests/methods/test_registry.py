"""The method registry ties config, builders and everything derived from them together.

A method is its module, its config section and one entry in ``methods/registry.py``; these
tests fail when an entry names a section the config lacks, a builder that does not exist or
builds another method, a builder away from the module of its layer or a module that does not
cite its maths, or when a consumer (sweep, report, export) keeps its own list.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from fractions import Fraction

import pytest

import adalora_cli.methods
from adalora_cli.config import ConfigError, RunConfig
from adalora_cli.methods import apply_method
from adalora_cli.methods.registry import (
    METHODS,
    check_method,
    comparable_config,
    config_digest,
    config_value,
    method_spec,
)
from tests.conftest import ROOT
from tests.methods._tiny import run_config, tiny_bert
from tests.test_docs_commands import anchors


@pytest.mark.e2e
def test_the_registry_and_the_report_load_no_torch():
    probe = ("import json, sys\n"
             "import adalora_cli.methods.registry, adalora_cli.report.tables\n"
             "import adalora_cli.report.render, adalora_cli.rundir.summary\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'transformers'))))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize("name", list(METHODS))
def test_each_entry_names_a_real_section_and_a_builder_of_itself(name):
    spec = METHODS[name]
    assert spec.name == name
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    if spec.section is not None:
        assert spec.section in sections
        assert dataclasses.is_dataclass(getattr(RunConfig(), spec.section))
    cfg = run_config(name)
    for key, _ in spec.size_keys + spec.unmatched_size_keys:
        assert isinstance(config_value(cfg, key), int), key  # a real config key
        # and a key of the method's own section: a size of another section is a typo
        assert key.split(".")[0] == spec.section, key
    module, function = spec.builder.split(":")
    builder = getattr(importlib.import_module(f"adalora_cli.methods.{module}"), function)
    assert callable(builder)
    handle = apply_method(tiny_bert(), cfg, None)  # builds through the registry
    assert handle.name == name and bool(handle.trainable) == spec.trains


def _method_modules() -> dict[str, object]:
    return {m.name: importlib.import_module(f"adalora_cli.methods.{m.name}")
            for m in pkgutil.iter_modules(adalora_cli.methods.__path__)}


def test_every_builder_in_the_methods_has_an_entry():
    """A ``build_*`` function defined anywhere in methods/ is some entry's builder, and every
    entry's builder is defined in the module it names (not imported into it)."""
    builders = {f"{name}:{n}" for name, module in _method_modules().items()
                for n, f in inspect.getmembers(module, inspect.isfunction)
                if n.startswith("build_") and f.__module__ == module.__name__}
    assert builders == {spec.builder for spec in METHODS.values()}


def _builder_module(spec):
    return importlib.import_module(f"adalora_cli.methods.{spec.builder.split(':')[0]}")


@pytest.mark.parametrize("name", list(METHODS))
def test_a_builder_lives_with_the_layer_it_wraps(name):
    """One place per method: the module that defines the layer the builder wraps the model
    with holds the builder too (rsLoRA and LoRA+ in lora.py, HAdapter and PAdapter in
    adapters.py); a method without a layer (BitFit, full, none) has its own module."""
    spec = METHODS[name]
    module = _builder_module(spec)
    handle = apply_method(tiny_bert(), run_config(name), None)
    kinds = {type(layer) for _, layer in handle.layers}
    if kinds:
        assert {k.__module__ for k in kinds} == {module.__name__}, (spec.builder, kinds)
    else:
        assert module.__name__.rsplit(".", 1)[1] in (name, "full"), spec.builder


MATHS = ROOT / "docs" / "maths.md"
PAPER = re.compile(r"\([A-Z][\w-]+(?: et al\.)?, (?:19|20)\d\d[;)]|\bEq\. ?\(?\d|\bTable \d")


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_module_cites_its_maths_section_and_the_paper(name):
    """The builder's module opens with the method's name as the tables print it, its paper
    (an author-year citation, an equation or a table) and its section of docs/maths.md: the
    method's own anchor where the page has one (docs/maths.md#dora), else one that exists."""
    spec = METHODS[name]
    doc = _builder_module(spec).__doc__
    assert spec.title in doc, (spec.builder, spec.title)
    assert PAPER.search(doc), spec.builder
    cited = set(re.findall(r"docs/maths\.md#([\w-]+)", doc))
    known = anchors(MATHS)
    assert cited and cited <= known, (spec.builder, cited - known)
    if name in known:
        assert name in cited, (spec.builder, name)


def test_the_maths_citation_check_is_real():
    # the pattern is not vacuous: a docstring without a paper or an anchor fails it
    assert PAPER.search("LoRA (Hu et al., 2022): h = W0 x") and PAPER.search("(Eq. 3)")
    assert not PAPER.search("A layer around a frozen linear (docs/maths.md#methods).")
    assert "no-such-anchor" not in anchors(MATHS) and "dora" in anchors(MATHS)


def test_the_paper_row_order_and_titles():
    # the base model first, the paper's rows, today's baselines after LoRA, and AdaLoRA last
    # as in Table 1
    assert list(METHODS) == ["none", "full", "bitfit", "houlsby", "pfeiffer", "lora", "rslora",
                             "dora", "pissa", "loraplus", "eva", "gora", "sora", "increlora",
                             "adalora"]
    assert [s.title for s in METHODS.values()] == [
        "Base model", "Full FT", "BitFit", "HAdapter", "PAdapter", "LoRA", "rsLoRA", "DoRA",
        "PiSSA", "LoRA+", "EVA", "GoRA", "SoRA", "IncreLoRA", "AdaLoRA"]
    assert [n for n, s in METHODS.items() if not s.trains] == ["none"]


def test_an_unknown_method_is_one_line_naming_every_choice():
    cfg = run_config("adalora")
    bad = dataclasses.replace(cfg, method=dataclasses.replace(cfg.method, name="qlora"))
    with pytest.raises(ConfigError) as info:
        check_method(bad)
    assert str(info.value) == ("unknown method.name 'qlora'; choose from none, full, bitfit, "
                               "houlsby, pfeiffer, lora, rslora, dora, pissa, loraplus, eva, "
                               "gora, sora, increlora, adalora")
    with pytest.raises(ConfigError, match="unknown method.name 'qlora'"):
        apply_method(tiny_bert(), bad, None)


def test_size_labels_by_hand():
    ada = run_config("adalora", adalora={"init_rank": 6, "budget": 144})
    assert method_spec("adalora").size_label(ada, None) == "r0=6 b(T)=144"
    assert method_spec("adalora").size_label(ada, 144) == "r0=6"  # the level says b(T)
    assert method_spec("lora").size_label(run_config("lora", lora={"r": 8}), 576) == "r=8"
    for adapter in ("houlsby", "pfeiffer"):
        cfg = run_config(adapter, adapter={"dim": 16})
        assert method_spec(adapter).size_label(cfg, None) == "d=16"
    assert method_spec("bitfit").size_label(run_config("bitfit"), 144) == ""
    assert method_spec("dora").size_label(run_config("dora", dora={"r": 4}), 288) == "r=4"
    assert method_spec("sora").size_label(run_config("sora", sora={"r_max": 6}), 288) == (
        "r_max=6")
    inc = run_config("increlora", increlora={"budget": 288})
    assert method_spec("increlora").size_label(inc, 288) == "r_init=1"
    assert method_spec("increlora").size_label(inc, None) == "r_init=1 b(T)=288"
    assert method_spec("full").size_label(run_config("full"), None) == ""
    assert method_spec("none").size_label(run_config("none"), 144) == ""


def test_budget_matching_at_rbar_2_on_72_matrices():
    # b(T) = 144 over n = 72: rbar 2 -> r0 4 (the paper's table), r 2, d 8 and 16
    got = {name: spec.size_overrides(144, 72) for name, spec in METHODS.items()}
    assert got == {"none": [], "full": [], "bitfit": [],
                   "houlsby": ["adapter.dim=8"], "pfeiffer": ["adapter.dim=16"],
                   "lora": ["lora.r=2"], "rslora": ["rslora.r=2"], "dora": ["dora.r=2"],
                   "pissa": ["pissa.r=2"], "loraplus": ["loraplus.r=2"],
                   "eva": ["eva.r=2", "eva.budget=144"],  # its total rank is b(T)
                   "gora": ["gora.r=2"],  # LoRA's budget at the mean rank
                   "sora": ["sora.r_max=4"],  # starts at AdaLoRA's r0
                   "increlora": ["increlora.budget=144"],  # grows to b(T) itself
                   "adalora": ["adalora.budget=144", "adalora.init_rank=4"]}
    assert METHODS["lora"].match(8, Fraction(8, 12)) == {"lora.r": 1}  # 0.67 rounds to 1


def test_export_and_weights_flags():
    assert {n: s.peft_type for n, s in METHODS.items() if s.peft_type} == {
        "lora": "LORA", "rslora": "LORA", "dora": "LORA", "pissa": "LORA", "loraplus": "LORA",
        "eva": "LORA", "gora": "LORA", "adalora": "ADALORA"}
    assert [n for n, s in METHODS.items() if not s.mergeable] == ["houlsby", "pfeiffer"]
    assert [n for n, s in METHODS.items() if s.saves_whole_model] == ["full"]


def test_consumers_derive_their_lists_from_the_registry(monkeypatch):
    """Sweep, report and export read the registry: a new entry shows in all of them."""
    from adalora_cli.artifacts import merged
    from adalora_cli.report import tables
    from adalora_cli.sweep import plan

    new = ("rslora", "dora", "pissa", "loraplus", "eva", "gora", "sora", "increlora")
    assert plan.SIZED == ("houlsby", "pfeiffer", "lora", *new, "adalora")
    assert merged.MERGEABLE == ("none", "full", "bitfit", "lora", *new, "adalora")
    assert tables.METHOD_NAMES == {n: s.title for n, s in METHODS.items()}
    extra = dataclasses.replace(METHODS["lora"], name="vera", title="VeRA")
    monkeypatch.setitem(METHODS, "vera", extra)
    assert plan.parse_methods("vera,lora") == ["vera", "lora"]
    assert plan.size_overrides("vera", 144, 72) == ["lora.r=2"]
    with pytest.raises(ConfigError, match="choose from none, full, .*, adalora, vera"):
        plan.parse_methods("qlora")


# --------------------------------------------------------------------------- run identity


def _digest(name: str, *overrides: str) -> str:
    from adalora_cli.config import apply_overrides, from_dict

    return config_digest(from_dict(apply_overrides({"method": {"name": name}},
                                                   list(overrides))))


def test_the_digest_ignores_the_seed_and_bookkeeping():
    base = _digest("adalora")
    for same in ("train.seed=7", "sweep.name=other", "sweep.budget_level=144",
                 "train.device=cpu", "train.eval_batch_size=8", "train.save_every=5",
                 "train.keep_checkpoints=3", "log.to=[tensorboard]", "train.save_weights=false",
                 "train.log_every=10", "lora.r=16", "adapter.dim=3"):  # unused sections too
        assert _digest("adalora", same) == base, same
    for differs in ("train.learning_rate=0.001", "train.max_steps=40",
                    "model.name_or_path=other", "adalora.budget=8", "task.name=mrpc",
                    "method.target_modules=[query]"):
        assert _digest("adalora", differs) != base, differs
    assert _digest("lora") != base


def test_the_digest_follows_what_each_method_reads():
    assert _digest("lora", "adalora.budget=8") == _digest("lora")  # plain LoRA: unread
    # prune-LoRA takes its budget from the adalora section
    assert _digest("lora", "lora.prune=true", "adalora.budget=8") != _digest(
        "lora", "lora.prune=true")
    # LoRA_regu takes the form of its regularizer (Eq. 4) from the adalora section too
    assert _digest("lora", "lora.gamma=0.1", "adalora.orth_reg=paper") != _digest(
        "lora", "lora.gamma=0.1")
    # bottleneck adapters never read target_modules (they sit at fixed sites)
    assert _digest("houlsby", "method.target_modules=[query]") == _digest("houlsby")
    assert _digest("houlsby", "adapter.dim=4") != _digest("houlsby")
    # with max_steps set, T = max_steps and epochs is never read
    assert _digest("lora", "train.max_steps=9", "train.epochs=1") == _digest(
        "lora", "train.max_steps=9")
    assert _digest("lora", "train.epochs=1") != _digest("lora")
    # IncreLoRA grows over AdaLoRA's phases unless its own are set
    assert _digest("increlora", "adalora.t_init=7") != _digest("increlora")
    pinned = ("increlora.t_init=1", "increlora.delta_t=1", "increlora.t_final=1")
    assert _digest("increlora", *pinned, "adalora.t_init=7") == _digest("increlora", *pinned)
    assert _digest("dora", "adalora.budget=8", "lora.r=3") == _digest("dora")
    assert _digest("dora", "dora.rslora=true") != _digest("dora")
    flat = comparable_config(run_config("bitfit"))
    assert "train.learning_rate" in flat and "train.seed" not in flat
    assert not any(k.split(".")[0] in ("adalora", "lora", "adapter") for k in flat)
