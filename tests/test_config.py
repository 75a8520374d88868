"""Config loading: every shipped YAML loads, overrides parse as YAML, errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from adalora_cli.config import ConfigError, apply_overrides, load_config
from adalora_cli.methods.registry import METHODS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "configs").rglob("*.yaml"))

# docs/maths.md#task-hyperparameters: lr, batch, epochs, gamma, t_i, delta_t, t_f
GLUE_TABLE = {
    "mnli": (5e-4, 32, 7, 0.1, 8000, 100, 50000),
    "rte": (1.2e-3, 32, 50, 0.3, 600, 1, 1800),
    "qnli": (1.2e-3, 32, 5, 0.1, 2000, 100, 8000),
    "mrpc": (1e-3, 32, 30, 0.1, 600, 1, 1800),
    "qqp": (5e-4, 32, 5, 0.1, 8000, 100, 25000),
    "sst2": (8e-4, 32, 24, 0.1, 6000, 100, 22000),
    "cola": (5e-4, 32, 25, 0.5, 800, 10, 3500),
    "stsb": (2.2e-3, 32, 25, 0.1, 800, 10, 2000),
}
ALPHA_16 = {"mnli", "sst2", "qqp"}


def test_configs_exist():
    assert len(SHIPPED) >= 10
    assert {p.stem for p in (ROOT / "configs" / "glue").glob("*.yaml")} == set(GLUE_TABLE)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.task.name
    assert cfg.method.name in METHODS  # the registry's names (checked there, not here)


@pytest.mark.parametrize("task", sorted(GLUE_TABLE))
def test_glue_configs_carry_spec_values(task):
    cfg = load_config(ROOT / "configs" / "glue" / f"{task}.yaml")
    lr, batch, epochs, gamma, t_i, delta_t, t_f = GLUE_TABLE[task]
    a, t = cfg.adalora, cfg.train
    assert (t.learning_rate, t.batch_size, t.epochs) == (lr, batch, epochs)
    assert (a.gamma, a.t_init, a.delta_t, a.t_final) == (gamma, t_i, delta_t, t_f)
    assert (a.budget, a.init_rank, a.beta1, a.beta2) == (144, 4, 0.85, 0.85)
    assert a.alpha == (16 if task in ALPHA_16 else 32)
    assert cfg.model.name_or_path == "microsoft/deberta-v3-base"
    assert cfg.task.name == task
    header = (ROOT / "configs" / "glue" / f"{task}.yaml").read_text().splitlines()[0]
    assert header.startswith("#") and task.upper() in header


def test_overrides_are_parsed_as_yaml():
    cfg = load_config(ROOT / "configs" / "glue" / "mnli.yaml",
                      ["method.name=lora", "lora.r=8", "train.seed=3",
                       "train.learning_rate=1e-4",
                       "method.target_modules=[query_proj, value_proj]"])
    assert cfg.method.name == "lora"
    assert cfg.lora.r == 8 and isinstance(cfg.lora.r, int)
    assert cfg.train.seed == 3
    assert cfg.train.learning_rate == pytest.approx(1e-4)
    assert cfg.method.target_modules == ["query_proj", "value_proj"]


def test_int_accepted_for_float_and_nested_sections_created():
    data = apply_overrides({}, ["adalora.alpha=16", "task.name=rte"])
    assert data == {"adalora": {"alpha": 16}, "task": {"name": "rte"}}


def test_unknown_key_named_by_full_path(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key adalora\.budjet"):
        load_config(ROOT / "configs" / "glue" / "rte.yaml", ["adalora.budjet=3"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("trian:\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"unknown config key trian"):
        load_config(bad)


def test_missing_file_and_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("task:\n  name: rte\n  max_length: [1, 2\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_config(bad)


@pytest.mark.parametrize("override, fragment", [
    ("train.batch_size=zero", "train.batch_size must be an integer"),
    ("adalora.beta1=1.5", "adalora.beta1 must lie in (0, 1)"),
    ("adalora.delta_t=0", "adalora.delta_t must be >= 1"),
    ("train.learning_rate=-1", "train.learning_rate must be > 0"),
    ("lora.prune=maybe", "lora.prune must be true or false"),
    ("seed", "is not key=value"),
])
def test_bad_values_give_one_line_errors(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "configs" / "glue" / "rte.yaml", [override])
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_each_section_checks_itself_however_it_is_made():
    """The checks live in each section's __post_init__: a section made in code, or changed
    with dataclasses.replace, is refused like a loaded one."""
    import dataclasses

    from adalora_cli.config import AdaLoRAConfig, LogConfig, LoRAConfig, TrainConfig

    with pytest.raises(ConfigError, match=r"^lora.r must be >= 1, got 0$"):
        LoRAConfig(r=0)
    with pytest.raises(ConfigError, match=r"train.length_split must lie between 1 and "
                                          r"train.batch_size \(32\), got 64"):
        dataclasses.replace(TrainConfig(), length_split=64)
    with pytest.raises(ConfigError, match=r"^adalora.alpha must be a finite number, got nan$"):
        AdaLoRAConfig(alpha=float("nan"))
    with pytest.raises(ConfigError, match="log.to names a tracker twice"):
        LogConfig(to=["wandb", "wandb"])
    assert TrainConfig(batch_size=4, length_split=4).length_split == 4  # the edge is allowed


def test_target_rank_states_the_budget_as_a_mean_rank():
    """adalora.target_rank: b(T) = round(target_rank * n) for the model's n matrices; a
    config may set it or adalora.budget, not both (an override of one on a config with the
    other is refused, naming both and the null that resolves it)."""
    from adalora_cli.config import AdaLoRAConfig

    assert AdaLoRAConfig(target_rank=8).final_budget(112) == 896  # Llama 3.2 1B: 16 x 7
    assert AdaLoRAConfig(target_rank=8).final_budget(182) == 1456  # Gemma 2 2B: 26 x 7
    assert AdaLoRAConfig(target_rank=1.5).final_budget(5) == 8  # 7.5 rounds half up
    assert AdaLoRAConfig(budget=50).final_budget(112) == 50  # without it: budget as given
    resolved = AdaLoRAConfig(target_rank=2).resolved(14)
    assert (resolved.budget, resolved.target_rank) == (28, None)
    smoke = ROOT / "configs" / "smoke" / "causal_lm.yaml"  # target_rank: 2
    # the command line wins: a budget override replaces the file's target_rank, and back
    assert load_config(smoke, ["adalora.budget=20"]).adalora.final_budget(14) == 20
    glue = ROOT / "configs" / "smoke" / "glue.yaml"  # budget: 16
    assert load_config(glue, ["adalora.target_rank=3"]).adalora.final_budget(12) == 36
    with pytest.raises(ConfigError) as info:  # both in one place: which was meant?
        load_config(smoke, ["adalora.budget=28", "adalora.target_rank=2"])
    assert str(info.value) == ("adalora.budget and adalora.target_rank are both set; keep "
                               "one (adalora.budget=null or adalora.target_rank=null)")
    with pytest.raises(ConfigError, match="target_rank must be > 0"):
        AdaLoRAConfig(target_rank=0)
    with pytest.raises(ConfigError, match="adalora.budget is null but adalora.target_rank"):
        AdaLoRAConfig(budget=None)
