"""EVA (docs/maths.md#eva): its ranks and initial A against PEFT's own EVA, its refusals,
and its pass inside a run."""

from __future__ import annotations

import copy

import pytest
import torch

from adalora_cli.config import ConfigError
from adalora_cli.engine.calibration import Collective
from adalora_cli.engine.distributed import World
from adalora_cli.methods import apply_method
from adalora_cli.methods.eva import EVALinear
from tests.methods._tiny import VOCAB, run_config, tiny_bert

TARGETS = ["query", "key", "value", "attention.output.dense", "intermediate.dense",
           "output.dense"]


def batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of 8 sequences of 12 tokens, some padded (attention mask 0)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (8, 12), generator=g)
        mask = torch.ones_like(ids)
        lengths = torch.randint(6, 13, (8,), generator=g)
        for i, n_tokens in enumerate(lengths.tolist()):
            mask[i, n_tokens:] = 0
            ids[i, n_tokens:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def ours(model, data, **eva):
    """Our pass on ``data`` the way the engine runs it (no labels: PEFT's label mask is a
    causal LM's); returns {module path: A} and the pass."""
    cfg = run_config("eva", eva=eva, method={"target_modules": TARGETS})
    handle = apply_method(model, cfg, total_steps=10)
    cal = handle.calibration
    model.eval()
    cal.begin(model, Collective(World()))
    with torch.no_grad():
        for batch in data:
            cal.inputs(batch)
            model(**batch)
            if cal.observe():
                break
    cal.end(model)
    return {path: layer.A.detach().clone() for path, layer in handle.layers}, cal


def peft_eva(model, data, r: int, rho: float, tau: float, exact: bool = True):
    """PEFT's EVA on ``data``; ``exact``: its incremental PCA with an exact SVD in place of
    the randomized one it uses by default (``IncrementalPCA(lowrank=True)``)."""
    from peft import EvaConfig, LoraConfig, get_peft_model, initialize_lora_eva_weights
    from peft.tuners.lora import eva as peft_eva_module
    from peft.utils.incremental_pca import IncrementalPCA

    class Exact(IncrementalPCA):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "lowrank": False})

    if exact:
        patch = pytest.MonkeyPatch.context()
        mp = patch.__enter__()
        mp.setattr(peft_eva_module, "IncrementalPCA", Exact)

    config = LoraConfig(r=r, lora_alpha=16, target_modules=TARGETS, init_lora_weights="eva",
                        eva_config=EvaConfig(rho=rho, tau=tau))
    peft_model = get_peft_model(model, config)
    try:
        initialize_lora_eva_weights(peft_model, dataloader=data, show_progress_bar=False)
    finally:
        if exact:
            patch.__exit__(None, None, None)
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            out[name.removeprefix("base_model.model.")] = (
                module.lora_A["default"].weight.detach().clone())
    return out


@pytest.mark.parametrize("exact,atol", [(True, 1e-5), (False, 2e-2)])
@pytest.mark.parametrize("r,rho,tau", [(2, 2.0, 0.99), (4, 1.5, 0.95)])
def test_ranks_and_initial_A_equal_peft_initialize_lora_eva_weights(r, rho, tau, exact, atol):
    """Same model, same batches, same settings: every module's rank equals PEFT's and its
    A equals PEFT's lora_A to ``atol`` per entry. Both order components by singular value
    and choose each right-singular vector's sign so that its largest entry is positive, so
    no sign or order is left free. PEFT's incremental PCA takes a randomized SVD by default
    (torch.svd_lowrank, q = 2k, 4 subspace iterations, seed 42) where ours is exact: with
    PEFT's SVD made exact the two agree to 1e-5 (measured: 2.7e-6 and 5.4e-6, float32 A
    from float64 fits); with its randomized one to 2e-2 (measured 9.7e-3 and 6.7e-4), and on
    the same ranks. The data converge within the batches given (16 and 12 of 40), so PEFT,
    which cycles its loader until convergence, reads the same batches we do."""
    data = batches(40)
    model = tiny_bert()
    theirs = peft_eva(copy.deepcopy(model), data, r, rho, tau, exact=exact)
    mine, cal = ours(model, data, r=r, rho=rho, tau=tau)
    assert not any(cal.active.values()), "our pass did not converge on the data given"
    ranks = {path: a.shape[0] for path, a in mine.items()}
    peft_ranks = {path: theirs[path].shape[0] if path in theirs else 0 for path in mine}
    # Layers that see one input (query, key, value) share one fit, so their components tie
    # in the redistribution. PEFT breaks such ties by torch.argsort's order, which is not
    # stable beyond a few dozen values, then gives the fit's owner the largest rank; ours
    # gives a tie to the earlier layer in model order. Owners and unshared layers match
    # exactly, and so does each group's multiset of ranks: which sharer holds a tied
    # component is the one thing left to argsort.
    groups: dict[str, list[str]] = {}
    for path, owner in cal.owner.items():
        groups.setdefault(owner, []).append(path)
    for owner, members in groups.items():
        assert ranks[owner] == peft_ranks[owner], owner
        assert sorted(ranks[p] for p in members) == sorted(peft_ranks[p] for p in members)
    assert sum(ranks.values()) == r * len(TARGETS) * 2  # the budget n * r, redistributed
    assert len(set(ranks.values())) > 1  # the test exercises a real redistribution
    for path, a in mine.items():
        n = min(a.shape[0], peft_ranks[path])  # (a sharer's rows are its owner's fit's)
        if n:
            torch.testing.assert_close(a[:n], theirs[path][:n], atol=atol, rtol=0)


def test_rank_is_capped_at_rho_r_and_layers_sharing_an_input_share_one_fit():
    data = batches(40)
    mine, cal = ours(tiny_bert(), data, r=2, rho=2.0)
    assert max(a.shape[0] for a in mine.values()) <= 4
    for layer in ("bert.encoder.layer.0", "bert.encoder.layer.1"):
        q, k, v = (f"{layer}.attention.self.{m}" for m in ("query", "key", "value"))
        assert cal.owner[k] == cal.owner[v] == q  # one input, one fit
        n = min(mine[q].shape[0], mine[k].shape[0])
        torch.testing.assert_close(mine[q][:n], mine[k][:n], atol=0, rtol=0)


def test_after_the_pass_the_layer_trains_from_A0_with_B_zero():
    model = tiny_bert()
    mine, cal = ours(model, batches(40), r=2)
    layer = dict(cal.layers)["bert.encoder.layer.0.attention.self.query"]
    assert isinstance(layer, EVALinear)
    assert layer.B.shape == (32, layer.r) and not layer.B.any()  # Delta W = 0 at step 0
    assert layer.scaling == 16.0 / 2  # adjust_scaling_factors: alpha / r on every layer
    # the rows of A are orthonormal: right-singular vectors
    eye = layer.A @ layer.A.T
    torch.testing.assert_close(eye, torch.eye(layer.r), atol=1e-5, rtol=0)


@pytest.mark.parametrize("rho", [0.5, 0.99])
def test_rho_below_one_is_refused_in_one_line(rho):
    with pytest.raises(ConfigError, match=r"^eva\.rho must be >= 1 .*got") as err:
        run_config("eva", eva={"rho": rho})
    assert "\n" not in str(err.value)


def test_a_resumed_run_takes_its_ranks_from_its_checkpoint_not_a_new_pass():
    """The ranks a pass chose are the shapes of the saved A; a rebuilt model restored from
    them has every module at that rank (the checkpoint's tensors then load into it)."""
    model = tiny_bert()
    mine, cal = ours(model, batches(40), r=2)
    saved = {name: p.detach() for name, p in model.named_parameters() if name.endswith(".A")}
    rebuilt = tiny_bert()
    handle = apply_method(rebuilt, run_config("eva", eva={"r": 2},
                                              method={"target_modules": TARGETS}), 10)
    ranks = handle.calibration.restore({k: v.shape for k, v in saved.items()})
    assert ranks == {path: a.shape[0] for path, a in mine.items()}
    rebuilt.load_state_dict(saved, strict=False)  # shapes fit: no size mismatch
    for path, layer in handle.layers:
        torch.testing.assert_close(layer.A, mine[path], atol=0, rtol=0)


def test_the_svd_sees_only_the_tokens_that_count():
    """Padding never enters the SVD; a causal LM's ignored labels (its prompt) do not
    either with eva.use_label_mask; an encoder-decoder's decoder rows are the positions
    whose labels count, its encoder rows those its attention mask keeps."""
    cfg = run_config("eva", eva={"r": 1}, method={"target_modules": ["query"]})
    model = tiny_bert()
    cal = apply_method(model, cfg, total_steps=10).calibration
    cal.begin(model, Collective(World()))
    hook = cal._hook("bert.encoder.layer.0.attention.self.query")
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    rows = cal.rows["bert.encoder.layer.0.attention.self.query"]
    lm_labels = torch.tensor([[-100, 5, 6, -100], [-100, 7, -100, -100]])
    cal.inputs({"input_ids": mask, "attention_mask": mask, "labels": lm_labels})
    hook(None, (x,), None)
    torch.testing.assert_close(rows.pop(), torch.stack([x[0, 1], x[0, 2], x[1, 1]]))
    cal.inputs({"input_ids": mask, "attention_mask": mask, "labels": torch.tensor([0, 1])})
    hook(None, (x,), None)  # a classifier's labels: every real token
    assert rows.pop().shape == (5, 3)
    seq2seq = torch.tensor([[4, -100], [5, 6]])  # the decoder's 2 positions
    cal.inputs({"input_ids": mask, "attention_mask": mask, "labels": seq2seq})
    hook(None, (x,), None)  # an encoder layer: the attention mask
    assert rows.pop().shape == (5, 3)
    hook(None, (x[:, :2],), None)  # a decoder layer: the labels that count
    torch.testing.assert_close(rows.pop(), torch.stack([x[0, 0], x[1, 0], x[1, 1]]))
