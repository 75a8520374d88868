"""GoRA's maths (adalora_cli/methods/gora.py) against a second implementation written here
from the paper's equations in numpy (He et al., 2025, Sec. 3; docs/maths.md#gora), on the
same hand-made gradients, and against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adalora_cli.config import ConfigError, GoRAConfig
from adalora_cli.engine.calibration import Collective
from adalora_cli.engine.distributed import World
from adalora_cli.methods import apply_method
from adalora_cli.methods.gora import (
    GoRALinear,
    allocate_ranks,
    importance,
    initial_B,
    plan,
    random_A,
)
from tests.methods._tiny import run_config, tiny_batch, tiny_bert

# --------------------------------------------------------------------------- the reference


def reference(weights: dict, grads: dict, A: dict, r: int, r_min: int, r_max: int,
              alpha: float, gamma: float):
    """The paper's equations, plainly: I = avg(|W * G|); a = I / sum I; P = r sum (m + n);
    r_i = clip(round(P a_i / (m_i + n_i)), r_min, r_max); B = -(gamma / s) sqrt(n / r_i)
    G pinv(A) with s = alpha / r."""
    I = {k: float(np.mean(np.abs(weights[k] * grads[k]))) for k in weights}  # noqa: E741
    a = {k: v / sum(I.values()) for k, v in I.items()}
    P = r * sum(sum(w.shape) for w in weights.values())
    ranks = {k: int(min(r_max, max(r_min, np.floor(P * a[k] / sum(weights[k].shape) + 0.5))))
             for k in weights}
    s = alpha / r
    B = {k: -(gamma / s) * math.sqrt(weights[k].shape[1] / ranks[k])
         * grads[k] @ np.linalg.pinv(A[k]) for k in weights}
    return I, a, ranks, B


def _hand_made(seed: int = 0) -> tuple[dict, dict]:
    """Four matrices of three shapes, weights and gradients of distinct scales."""
    rng = np.random.default_rng(seed)
    shapes = {"q": (6, 5), "k": (6, 5), "ffn": (7, 5), "out": (5, 7)}
    weights = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = {k: rng.normal(scale=(i + 1) ** 2, size=s) for i, (k, s) in enumerate(shapes.items())}
    return weights, grads


def test_importance_ranks_and_factors_equal_the_reference():
    weights, grads = _hand_made()
    cfg = GoRAConfig(r=2, alpha=8.0, r_min=1, r_max=4, init_scale=0.1)
    got = plan({k: torch.tensor(v) for k, v in weights.items()},
               {k: torch.tensor(v) for k, v in grads.items()}, cfg,
               generator=torch.Generator().manual_seed(3))
    A = {k: got.A[k].double().numpy() for k in weights}  # A is random: the reference uses ours
    I, a, ranks, B = reference(weights, grads, A, 2, 1, 4, 8.0, 0.1)
    assert got.importance == pytest.approx(I, rel=1e-12)
    assert got.share == pytest.approx(a, rel=1e-12)
    assert got.ranks == ranks
    assert len(set(ranks.values())) > 1  # the gradients' scales really move the ranks
    for k in weights:
        assert got.A[k].shape == (ranks[k], weights[k].shape[1])
        np.testing.assert_allclose(got.B[k].double().numpy(), B[k], rtol=1e-5, atol=1e-7)


def test_ranks_by_hand():
    # three 4x4 matrices (d_in + d_out = 8) with importance 3, 5, 8: a = 3/16, 5/16, 1/2;
    # P = r * 24 = 48 at r = 2, so P a / 8 = 1.125, 1.875, 3 -> ranks 1, 2, 3 (sum 6 = n r;
    # flooring would give 1, 1, 3)
    dims = {"a": (4, 4), "b": (4, 4), "c": (4, 4)}
    assert allocate_ranks({"a": 3.0, "b": 5.0, "c": 8.0}, dims, 2, 1, 8) == {
        "a": 1, "b": 2, "c": 3}
    # the bounds clip: r_min 2 lifts "a", r_max 2 caps "c"; a 4x4 matrix never above 4
    assert allocate_ranks({"a": 3.0, "b": 5.0, "c": 8.0}, dims, 2, 2, 2) == {
        "a": 2, "b": 2, "c": 2}
    assert allocate_ranks({"a": 0.0, "b": 0.0, "c": 1.0}, dims, 2, 1, 8)["c"] == 4
    # importance is mean(|W * G|): W = [[1, -2]], G = [[3, 0.5]] -> (3 + 1) / 2 = 2
    assert importance(torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 0.5]])) == 2.0


def test_B_by_hand():
    # A picks the first two of four input coordinates, so G A^+ is G's first two columns;
    # gamma 0.1, s = 2: B = -(0.1 / 2) sqrt(4 / 2) G[:, :2]
    G = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 1.0, 2.0]])
    A = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    expected = -0.05 * math.sqrt(2) * torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    torch.testing.assert_close(initial_B(G, A, scaling=2.0, gamma=0.1), expected)
    # at full rank A^+ A = I: the adapter's start s B A is exactly the step -gamma G
    A_full = random_A(4, 4, torch.Generator().manual_seed(0))
    B = initial_B(G, A_full, scaling=2.0, gamma=0.1)
    torch.testing.assert_close(2.0 * B @ A_full, -0.1 * G, atol=1e-6, rtol=1e-5)


def test_A_is_lora_uniform_and_seeded():
    A = random_A(64, 25, torch.Generator().manual_seed(1))
    assert A.shape == (64, 25) and A.abs().max() <= 1 / 5  # bound 1 / sqrt(d_in)
    assert A.abs().max() > 0.19  # and it fills it (1600 draws)
    torch.testing.assert_close(A, random_A(64, 25, torch.Generator().manual_seed(1)))


def test_the_start_is_a_descent_step_on_the_model():
    """B from -G: at step 0 the loss on the batch the gradient came from falls by what the
    first-order change sum <G, s B A> predicts, and the layer computes W0 x + (alpha / r)
    B A x with the mean rank r whatever its own rank."""
    model = tiny_bert()
    batch = tiny_batch()
    cfg = run_config("gora", gora={"r": 2, "alpha": 4.0, "r_min": 1, "r_max": 6,
                                   "init_scale": 20.0})
    handle = apply_method(model, cfg, None)  # uniform rank 2, B = 0: the base model
    layers = dict(handle.layers)
    weights = {p: m.base.weight for p, m in layers.items()}
    for w in weights.values():
        w.requires_grad_(True)
    before = model(**batch).loss
    before.backward()
    grads = {p: w.grad.detach().clone() for p, w in weights.items()}
    decided = plan({p: w.detach() for p, w in weights.items()}, grads, cfg.gora,
                   torch.Generator().manual_seed(0))
    for p, m in layers.items():
        m.reset(decided.ranks[p], decided.A[p], decided.B[p])
    assert sorted(m.r for m in layers.values()) == sorted(decided.ranks.values())
    assert len({m.r for m in layers.values()}) > 1  # the ranks really differ
    with torch.no_grad():
        after = model(**batch).loss
        predicted = sum((grads[p] * m.delta_weight()).sum() for p, m in layers.items())
    assert predicted < 0
    assert (after - before).item() == pytest.approx(predicted.item(), rel=0.05)
    layer = next(iter(layers.values()))
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), layer.base(x) + 2.0 * x @ (layer.B @ layer.A).T)


def test_a_goralinear_counts_its_own_rank():
    base = torch.nn.Linear(5, 3)
    layer = GoRALinear(base, rank=4, mean_rank=2, alpha=4.0)
    assert layer.scaling == 2.0
    assert sum(p.numel() for p in layer.adapter_parameters()) == 4 * (5 + 3)


@pytest.mark.parametrize("values, message", [
    ({"r": 4, "r_min": 5}, "gora's rank bounds must satisfy 1 <= r_min <= r <= r_max, got "
                           "r_min=5, r=4, r_max=16; set gora.r_min and gora.r_max around gora.r"),
    ({"r": 4, "r_max": 3}, "gora's rank bounds must satisfy 1 <= r_min <= r <= r_max, got "
                           "r_min=2, r=4, r_max=3; set gora.r_min and gora.r_max around gora.r"),
    ({"r_min": 0}, "gora's rank bounds must satisfy 1 <= r_min <= r <= r_max, got "
                   "r_min=0, r=8, r_max=32; set gora.r_min and gora.r_max around gora.r"),
    ({"n_batches": 0}, "gora.n_batches must be >= 1 when set, got 0"),
])
def test_bad_bounds_are_one_line(values, message):
    with pytest.raises(ConfigError) as info:
        run_config("gora", gora=values)
    assert str(info.value) == message


def test_a_4_bit_base_is_refused_in_one_line():
    # an NF4 weight takes no gradient, so its matrix would score 0 and sit at r_min
    with pytest.raises(ConfigError) as info:
        apply_method(tiny_bert(), run_config("gora", model={"quantize": "nf4"}), None)
    assert str(info.value) == (
        "gora reads the gradients of the frozen weights, which a model.quantize=nf4 base "
        "does not give; train GoRA on an unquantized base (model.quantize=none)")


def test_the_paper_defaults():
    cfg = GoRAConfig()
    assert (cfg.r, cfg.bounds(), cfg.n_batches, cfg.alpha) == (8, (4, 32), 64, 16.0)


# --------------------------------------------------------------------------- the pass


def test_the_pass_plans_from_the_mean_gradient_of_its_batches():
    """GoRAPass driven as the engine drives it (adalora_cli/engine/calibration.py) over
    three batches: the ranks and factors are plan()'s on the mean of the three batches'
    gradients, computed here by plain autograd, with A drawn from train.seed."""
    cfg = run_config("gora", gora={"r": 2, "alpha": 4.0, "r_min": 1, "r_max": 6,
                                   "n_batches": 3}, train={"seed": 5})
    data = [tiny_batch(seed) for seed in range(3)]

    reference_model = tiny_bert()
    paths = [p for p, _ in apply_method(tiny_bert(), cfg, None).layers]
    weights = {p: reference_model.get_submodule(p).weight for p in paths}
    for w in weights.values():
        w.requires_grad_(True)
    for batch in data:  # the mean gradient: each batch's loss / 3
        (reference_model(**batch).loss / 3).backward()
    expected = plan({p: w.detach() for p, w in weights.items()},
                    {p: w.grad for p, w in weights.items()}, cfg.gora,
                    torch.Generator().manual_seed(5))

    model = tiny_bert()
    handle = apply_method(model, cfg, total_steps=10)
    cal = handle.calibration
    assert (cal.n_batches, cal.needs_grad) == (3, True)
    cal.begin(model, Collective(World()))
    for batch in data:
        cal.inputs(batch)
        model(**batch).loss.backward()
        assert cal.observe() is False
    assert cal.end(model) == expected.ranks
    for p, layer in handle.layers:
        torch.testing.assert_close(layer.A.detach(), expected.A[p])
        torch.testing.assert_close(layer.B.detach(), expected.B[p], rtol=1e-4, atol=1e-8)
        assert not layer.base.weight.requires_grad  # frozen again after the pass
    assert cal.summary() == (f"GoRA: ranks {min(expected.ranks.values())} to "
                             f"{max(expected.ranks.values())} over 12 matrices, "
                             f"{sum(expected.ranks.values())} in all (mean rank 2), "
                             "from 3 batches")


def test_a_smoke_run_trains_at_the_ranks_it_wrote(smoke_runs):
    """configs/smoke/glue.yaml trains GoRA end to end: rank_pattern.json holds a rank per
    adapted matrix within the bounds, the saved A and B have those ranks, and the summary
    counts exactly sum r_i (d_in + d_out) adapter parameters."""
    import json

    from safetensors.torch import load_file

    run = smoke_runs("configs/smoke/glue.yaml", "method.name=gora", "train.max_steps=4")
    ranks = json.loads((run / "rank_pattern.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    tensors = load_file(run / "adapter_model.safetensors")
    assert len(ranks) == 12 and all(1 <= r <= 8 for r in ranks.values())  # [r/2, 4 r] at r 2
    assert len(set(ranks.values())) > 1
    cost = 0
    for path, r in ranks.items():
        A, B = tensors[f"{path}.A"], tensors[f"{path}.B"]
        assert A.shape[0] == r and B.shape[1] == r
        cost += r * (A.shape[1] + B.shape[0])
    assert summary["adapter_params"] == cost == summary["final_adapter_params"]
    assert summary["final_budget"] == sum(ranks.values())
    assert (run / "rank_heatmap.png").is_file()


def test_more_pass_batches_than_the_data_holds_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from adalora_cli.cli import app
    from tests.conftest import ROOT

    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        result = CliRunner().invoke(app, ["train", "configs/smoke/glue.yaml",
                                          "method.name=gora", "gora.n_batches=9",
                                          "--run-dir", str(out), "--quiet"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: gora.n_batches=9 but the training split holds only 8 batches of "
        "train.batch_size=8 (64 examples); lower gora.n_batches to at most 8 (or leave it "
        "unset: up to one epoch)")
    assert not out.exists()


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("fmt", ["peft", "lora"])
def test_the_export_loads_in_peft_alone_with_the_runs_logits(smoke_runs, tmp_path, fmt):
    """A GoRA run comes back at the ranks its pass chose (load_run restores them from the
    saved tensors), and exports as a PEFT LoraConfig whose rank_pattern holds each module's
    rank and alpha_pattern keeps s = alpha / r in each: PEFT alone gives the run's logits.
    B is amplified 40 times first, so one wrong rank or scale moves them far past 1e-5."""
    import json

    from safetensors.torch import load_file, save_file

    from tests.artifacts.test_export_baselines import _batch, _export, _ours, assert_peft_reproduces
    from tests.conftest import copy_of

    shared = smoke_runs("configs/smoke/glue.yaml", "method.name=gora", "train.max_steps=4")
    run = copy_of(shared, tmp_path / "run")
    weights = run / "adapter_model.safetensors"
    state = load_file(str(weights))
    save_file({k: v * 40.0 if k.endswith(".B") else v for k, v in state.items()}, str(weights))
    ranks = json.loads((run / "rank_pattern.json").read_text())
    _export(run, fmt, tmp_path / fmt)
    config = json.loads((tmp_path / fmt / "adapter_config.json").read_text())
    assert config["rank_pattern"] == ranks and config["r"] == max(ranks.values())
    if fmt == "peft":  # s = alpha / r = 8 / 2 = 4 in every module: alpha_m = 4 r_m
        assert config["alpha_pattern"] == {p: 4.0 * r for p, r in ranks.items()}
    batch = _batch()
    ref = _ours(run, batch)
    assert_peft_reproduces(tmp_path / fmt, batch, ref)


@pytest.mark.e2e
def test_two_processes_choose_the_ranks_of_one(smoke_runs, tmp_path):
    """A GoRA run under DDP (two processes, each half of every batch) trains, and chooses
    the ranks one process chooses (the sum itself is checked by the test after this)."""
    import json

    from tests.engine.test_distributed import adalora

    one = smoke_runs("configs/smoke/glue.yaml", "method.name=gora", "train.max_steps=4")
    two = tmp_path / "two"
    proc = adalora("train", "configs/smoke/glue.yaml", "method.name=gora", "train.max_steps=4",
                   "--nproc", "2", "--run-dir", str(two), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (json.loads((two / "rank_pattern.json").read_text())
            == json.loads((one / "rank_pattern.json").read_text()))


class _Partner:
    """One of two processes' Collective: ``sum`` adds what the other process holds, layer
    by layer in the pass's order (recorded from a first pass of that process)."""

    def __init__(self, other: list[torch.Tensor] | None):
        self.other, self.seen = other, []

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        self.seen.append(t.clone())
        return t if self.other is None else t + self.other[len(self.seen) - 1]


def test_two_processes_sum_their_halves_into_the_whole_batchs_gradient():
    """Each of two processes runs the pass on its half of every batch, its loss weighted by
    its share (1/2), as the engine weights it; summed across them, both choose exactly the
    ranks and factors one process chooses on the whole batches."""
    cfg = run_config("gora", gora={"r": 2, "alpha": 4.0, "r_min": 1, "r_max": 6,
                                   "n_batches": 2})
    data = [tiny_batch(seed) for seed in range(2)]  # 4 rows each
    halves = [[{k: v[i * 2:(i + 1) * 2] for k, v in b.items()} for b in data] for i in (0, 1)]

    def run(batches, share, collective):
        model = tiny_bert()
        handle = apply_method(model, cfg, total_steps=10)
        cal = handle.calibration
        cal.begin(model, collective)
        for batch in batches:
            (model(**batch).loss * share).backward()
            cal.observe()
        return cal.end(model), {p: (m.A.detach(), m.B.detach()) for p, m in handle.layers}

    whole = run(data, 1.0, _Partner(None))
    alone = [_Partner(None), _Partner(None)]
    for half, rec in zip(halves, alone):
        run(half, 0.5, rec)  # what each process holds before the sum
    for i in (0, 1):
        ranks, factors = run(halves[i], 0.5, _Partner(alone[1 - i].seen))
        assert ranks == whole[0]
        for p, (A, B) in factors.items():
            torch.testing.assert_close(A, whole[1][p][0])
            torch.testing.assert_close(B, whole[1][p][1], rtol=1e-4, atol=1e-7)
    # a process alone (no sum) would not: its half's gradient gives another B
    ranks, factors = run(halves[0], 0.5, _Partner(None))
    assert any(not torch.allclose(factors[p][1], whole[1][p][1]) if ranks[p] == whole[0][p]
               else True for p in factors)


@pytest.mark.e2e
def test_a_killed_run_resumes_at_its_ranks_to_the_uninterrupted_weights(tmp_path):
    """Killed after step 6 (checkpoint at 4), the resumed run makes no new pass: it takes
    its ranks from the checkpoint and ends on exactly the uninterrupted run's tensors."""
    import json

    from safetensors.torch import load_file

    from tests.engine.test_distributed import adalora

    common = ("train", "configs/smoke/glue.yaml", "method.name=gora", "train.max_steps=12",
              "train.save_every=4", "--quiet", "--run-dir")
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    first = adalora(*common, str(killed), env={"ADALORA_FAULT": "kill@step=6"})
    assert first.returncode != 0 and not (killed / "summary.json").exists()
    resumed = adalora("train", "--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    said = resumed.stdout + resumed.stderr
    assert "GoRA gradient pass" not in said and "as the checkpoint holds them" in said
    assert adalora(*common, str(whole)).returncode == 0
    assert ((killed / "rank_pattern.json").read_text()
            == (whole / "rank_pattern.json").read_text())
    assert len(set(json.loads((whole / "rank_pattern.json").read_text()).values())) > 1
    got, want = (load_file(run / "adapter_model.safetensors") for run in (killed, whole))
    assert sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


def test_fsdp_is_refused_in_one_line(in_repo):
    from adalora_cli.engine.sharding import check
    from tests.engine.test_sharding import CPU, TWO, _cfg, _ran

    cfg = _cfg("method.name=gora")
    with pytest.raises(ConfigError, match="^method.name=gora does not run sharded yet"):
        check(cfg, TWO, _ran(cfg, CPU, torch.bfloat16))
