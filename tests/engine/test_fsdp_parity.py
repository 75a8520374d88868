"""FSDP on two processes computes what one process computes, step by step.

Two forked ranks (gloo, CPU) shard the dropout-free tiny BERT with ``train.sharding=fsdp``
and take the same optimizer steps on the same global batches of 16 as one process does
with the whole model: the loss, the orthogonal regularizer, every gradient (gathered
whole), the budget, the mask, the allocator's averages and the trained weights must agree
to float rounding. The schedule is cut short (T = 6, a mask event at steps 2-4, the final
pattern from step 5) so every part of the allocator runs.

gloo's AVG reduction once summed instead of averaging under FSDP (pytorch issue 162338),
which would double every gradient here; one case simulates that bug inside the ranks and
the gradients must still be the one-process ones (engine/sharding.py never asks gloo to
average).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import pytest
import torch

from adalora_cli.config import load_config
from adalora_cli.engine.build import build_run
from adalora_cli.engine.distributed import World, global_mean, init, shard, shutdown
from adalora_cli.engine.outputs import trained_state
from adalora_cli.engine.step import Stepper

from .conftest import SMOKE

STEPS = 6
SHORT = ["train.batch_size=16", f"train.max_steps={STEPS}", "adalora.t_init=1",
         "adalora.delta_t=1", "adalora.t_final=2", "train.warmup_steps=0"]
METHODS = {
    "adalora": [],
    "prune-lora": ["method.name=lora", "lora.prune=true", "lora.r=4", "lora.gamma=0.1"],
    "houlsby": ["method.name=houlsby"],
    "bitfit": ["method.name=bitfit"],
}



def _whole(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train_steps(overrides: list[str], w: World) -> dict:
    """``STEPS`` optimizer steps on the first global batches, recording everything."""
    from adalora_cli.engine import sharding

    cfg = load_config(SMOKE, overrides)
    built = build_run(cfg, w)
    model, handle, data = built.model, built.handle, built.data
    if w.distributed:
        init(w, "cpu")
        sharding.shard(model, handle, w, built.device, None)
    stepper = Stepper.build(model, handle, cfg.train, built.steps, built.precision)
    out: dict = {"loss": [], "reg": [], "grads": [], "norm": [], "budget": [], "mask": []}
    norms = []
    clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, *args, **kwargs):  # the norm clipping saw
        norms.append(float(_whole(clip(params, max_norm, *args, **kwargs))))
        return norms[-1]

    torch.nn.utils.clip_grad_norm_ = spy
    try:
        for t in range(1, STEPS + 1):
            batch = [(16 * (t - 1) + k) % len(data.train) for k in range(16)]
            mine, weight = shard(batch, w) if w.distributed else (batch, 1.0)
            loss, reg = stepper.backward(data.collate([data.train[i] for i in mine]), weight)
            out["loss"].append(float(global_mean(loss, weight, w)))
            out["reg"].append(None if reg is None else float(reg.detach()))
            out["grads"].append({name: _whole(p.grad) for name, p in model.named_parameters()
                                 if p.grad is not None})
            log = stepper.update(t)
            out["budget"].append(log.budget)
            if handle.allocator is not None:
                out["mask"].append(handle.allocator.mask.clone())
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    out["norm"] = norms
    if w.distributed:
        final = sharding.gather_final(model, handle)
        out["weights"], out["allocator"] = final.weights, final.allocator
    else:
        out["weights"] = trained_state(model, handle)
        out["allocator"] = handle.allocator.state_dict() if handle.allocator else None
    return out


def _rank(rank: int, port: int, overrides: list[str], out: str, avg_bug: bool) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    calls = {"reduce_scatter": 0}
    if avg_bug:  # gloo averaging by summing, as in pytorch issue 162338
        import torch.distributed as dist

        def summing(real):
            def reduce_scatter(*args, **kwargs):
                calls["reduce_scatter"] += 1
                if kwargs.get("op") == dist.ReduceOp.AVG:
                    kwargs["op"] = dist.ReduceOp.SUM
                return real(*args, **kwargs)
            return reduce_scatter

        for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            setattr(dist, name, summing(getattr(dist, name)))
    try:
        record = train_steps(overrides, World(rank, 2, rank))
        record["calls"] = calls
        if rank == 0:
            torch.save(record, out)
    finally:
        shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(overrides: list[str], tmp_path: Path, avg_bug: bool = False) -> dict:
    out = str(tmp_path / "record.pt")
    ctx, port = mp.get_context("fork"), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, overrides, out, avg_bug))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    return torch.load(out, weights_only=False)


def assert_same_steps(one: dict, two: dict) -> None:
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    if one["reg"][0] is None:  # a method without the regularizer
        assert two["reg"] == one["reg"]
    else:
        assert two["reg"] == pytest.approx(one["reg"], rel=1e-6)
    assert two["norm"] == pytest.approx(one["norm"], rel=1e-5)
    for g1, g2 in zip(one["grads"], two["grads"]):
        assert sorted(g1) == sorted(g2)
        for name in g1:
            torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-7, msg=name)
    assert two["budget"] == one["budget"]
    assert len(two["mask"]) == len(one["mask"])
    for m1, m2 in zip(one["mask"], two["mask"]):
        assert torch.equal(m1, m2)
    assert sorted(one["weights"]) == sorted(two["weights"])
    for name, w1 in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w1, rtol=0, atol=1e-5, msg=name)
    if one["allocator"] is not None:
        for key in ("I", "I_bar", "U_bar"):
            torch.testing.assert_close(two["allocator"][key], one["allocator"][key],
                                       rtol=1e-4, atol=1e-9)
        assert torch.equal(two["allocator"]["mask"], one["allocator"]["mask"])


@pytest.mark.e2e
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_sharded_ranks_take_the_one_process_steps(no_dropout, method, tmp_path, in_repo):
    overrides = [f"model.name_or_path={no_dropout}", *SHORT, *METHODS[method]]
    one = train_steps(overrides, World())
    two = two_ranks([*overrides, "train.sharding=fsdp"], tmp_path)
    assert_same_steps(one, two)
    if method in ("adalora", "prune-lora"):  # the schedule really pruned
        # b(t) = 16 + 32 * ((T - t_final - t) / (T - t_init - t_final))^3 for 1 < t <= 4,
        # floored: 16 + 32 * 8/27 and 16 + 32/27 at t = 2, 3; b(T) = 16 after
        budgets = [48, 16 + 32 * 8 // 27, 16 + 32 // 27, 16, 16, 16]
        assert one["budget"] == budgets == [48, 25, 17, 16, 16, 16]
        assert [int(m.sum()) for m in one["mask"]] == budgets
        assert one["reg"][0] > 0


@pytest.mark.e2e
def test_gradients_stay_averaged_if_gloo_sums_for_avg(no_dropout, tmp_path, in_repo):
    overrides = [f"model.name_or_path={no_dropout}", *SHORT]
    one = train_steps(overrides, World())
    two = two_ranks([*overrides, "train.sharding=fsdp"], tmp_path, avg_bug=True)
    assert two["calls"]["reduce_scatter"] >= STEPS  # the gradients went through the bug
    assert_same_steps(one, two)


def _bf16_rank(rank: int, port: int, out: str) -> None:
    """One bf16 step under the policy ``train.precision=bf16`` gives on a GPU."""
    from adalora_cli.engine import sharding
    from adalora_cli.methods.adalora import SVDLinear

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    w = World(rank, 2, rank)
    try:
        cfg = load_config(SMOKE, ["train.batch_size=16", "train.sharding=fsdp"])
        built = build_run(cfg, w)
        init(w, "cpu")
        model, handle = built.model, built.handle
        sharding.shard(model, handle, w, built.device, torch.bfloat16)  # the GPU policy, on gloo
        seen = []
        layer = next(m for m in model.modules() if isinstance(m, SVDLinear))
        layer.register_forward_pre_hook(lambda m, args: seen.append(
            (m.P.dtype, m.base.weight.dtype)))
        stepper = Stepper.build(model, handle, cfg.train, built.steps, built.precision)
        mine, weight = shard(list(range(16)), w)
        stepper.backward(built.data.collate([built.data.train[i] for i in mine]), weight)
        grads = {p.grad.dtype for p in handle.trainable}
        stepper.update(1)
        state = {t.dtype for s in stepper.optimizer.state.values() for t in s.values()
                 if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0}
        kept = {p.to_local().dtype for p in handle.trainable}
        if rank == 0:
            torch.save({"seen": seen, "grads": grads, "state": state, "kept": kept}, out)
    finally:
        shutdown()


@pytest.mark.e2e
def test_bf16_computes_in_bf16_and_keeps_fp32(tmp_path, in_repo):
    """``train.precision=bf16``: the forward sees bf16 copies of every weight, while the
    sharded adapter and head parameters, their gradients and AdamW's state stay fp32."""
    out = str(tmp_path / "bf16.pt")
    ctx, port = mp.get_context("fork"), _free_port()
    procs = [ctx.Process(target=_bf16_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    record = torch.load(out, weights_only=False)
    assert record["seen"] == [(torch.bfloat16, torch.bfloat16)]
    assert record["grads"] == record["state"] == record["kept"] == {torch.float32}
