"""Where an AdaLoRA step spends its time beside a LoRA step, and where a step waits for the GPU.

step_time.py says how much slower AdaLoRA's step is than LoRA's; this says why. It builds
the same two steppers (same model, matrices, rank, batch and the loop's own step), then:

1. on CUDA, runs steps without a mask event under ``torch.cuda.set_sync_debug_mode`` and
   prints each host sync with the Python lines that caused it (the frames of this repo and
   of the libraries it calls, innermost first);
2. profiles a few such steps of each method with ``torch.profiler`` and prints, per step,
   the kernels launched, the GPU's kernel time and the host's time, then the operators
   whose count or time differ most between the two methods. Full tables go to ``--out``.

    python benchmarks/step_profile.py --device cuda --precision bf16 --shape bart-large \
        --models /tmp/ps --out /tmp/profile

On the CPU (``--tiny``) it is a rehearsal: there are no syncs to count and no kernels.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import traceback
import warnings
from pathlib import Path

import torch
from step_time import alternate, demo_setup, make_stepper, paper_shape, real_batch

HERE = Path(__file__).resolve().parent.parent


def _short(filename: str) -> str:
    """A frame's file relative to this repo or to site-packages."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(HERE))
    except ValueError:
        parts = path.parts
        for anchor in ("site-packages", "dist-packages"):
            if anchor in parts:
                return "/".join(parts[parts.index(anchor) + 1:])
        return filename


def _skip_to_mask_free(step) -> None:
    """Step until the next three steps have no mask event (delta_t 10 in make_stepper)."""
    while step.state["t"] % 10 != 3:
        step()


def sync_sites(step, steps: int = 3, depth: int = 4) -> collections.Counter:
    """Each host sync of ``steps`` mask-free CUDA steps, keyed by its innermost ``depth``
    Python frames (the warning machinery and this file left out), counted per step."""
    _skip_to_mask_free(step)
    torch.cuda.synchronize()
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not f.filename.endswith(("warnings.py", "step_profile.py"))]
        if frames and frames[-1].name == "set_sync_debug_mode":
            return  # the switch itself, on its first use: not the step's
        sites[tuple(f"{_short(f.filename)}:{f.lineno} {f.name}"
                    for f in reversed(frames[-depth:]))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()  # explicit: not reported
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return collections.Counter({k: v / steps for k, v in sites.items()})


def _time(avg, kind: str) -> float:
    """An averaged event's self time in microseconds (``kind``: cpu or device)."""
    if kind == "cpu":
        return avg.self_cpu_time_total
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(avg, name):
            return getattr(avg, name)
    return 0.0


def profile(step, steps: int, cuda: bool):
    """``torch.profiler`` over ``steps`` mask-free steps; returns the averaged events."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    _skip_to_mask_free(step)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    # the profiler warns about events left open at its edges; they are not the step's
    with warnings.catch_warnings(), torch_profile(activities=activities) as prof:
        warnings.simplefilter("ignore")
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    return prof.key_averages()


def summary(avgs, steps: int) -> dict[str, float]:
    """Per step: kernels launched, GPU kernel microseconds, host microseconds of the step."""
    launches = sum(a.count for a in avgs if "LaunchKernel" in a.key)
    gpu = sum(_time(a, "device") for a in avgs if a.device_type.name == "CUDA")
    host = sum(a.self_cpu_time_total for a in avgs)
    return {"kernels": launches / steps, "gpu_us": gpu / steps, "host_us": host / steps}


def differences(ada, lora, steps: int, top: int = 15) -> list[tuple[str, float, float, float]]:
    """(operator, count difference, host us difference, GPU us difference) per step, the
    largest host-time differences first: what AdaLoRA's step does that LoRA's does not."""
    def table(avgs):
        return {a.key: (a.count, a.self_cpu_time_total, _time(a, "device")) for a in avgs}

    a, b = table(ada), table(lora)
    rows = []
    for key in set(a) | set(b):
        (ca, ha, ga), (cb, hb, gb) = a.get(key, (0, 0.0, 0.0)), b.get(key, (0, 0.0, 0.0))
        rows.append((key, (ca - cb) / steps, (ha - hb) / steps, (ga - gb) / steps))
    rows.sort(key=lambda r: -abs(r[2]) - abs(r[3]))
    return rows[:top]


def _no_regularizer(model, handle) -> None:
    handle.regularizer = None


def _no_allocator(model, handle) -> None:
    handle.after_step = None


def _folded(model, handle) -> None:
    """Eq. 3 with diag(lam) and the scaling folded into Q (r0 x d_in) before the product,
    instead of multiplying the (batch, tokens, r0) and (batch, tokens, d_out) activations."""
    import types

    def forward(self, x):
        q = self.Q * (self.lam * self.scaling).unsqueeze(1)  # (r0, d_in)
        return self.base(x) + (self.dropout(x) @ q.T) @ self.P.T

    for _, layer in handle.layers:
        layer.forward = types.MethodType(forward, layer)


def _plain_eq3(model, handle) -> None:
    """Eq. 3 as SVDLinear computed it before ``scaled_rank`` (6c045bc): autograd's own
    multiply by the fp32 ``lam``, with the casts autocast adds around it. The same numbers
    (tests/methods/test_scaled_rank.py); what the one autograd function saves, timed."""
    import types

    def forward(self, x):
        z = (self.dropout(x) @ self.Q.T) * self.lam  # (..., r0), fp32 under autocast
        return self.base(x) + (z @ self.P.T) * self.scaling

    for _, layer in handle.layers:
        layer.forward = types.MethodType(forward, layer)


def _lam_cast(model, handle, scaled: bool = False) -> None:
    """Eq. 3 with ``lam`` (r0 entries) cast to the activations' dtype instead of the
    (batch, tokens, r0) activations to fp32 and back, which autocast's bf16 matmuls force
    when the fp32 ``lam`` multiplies them; ``scaled`` also folds alpha / r0 into ``lam``'s
    copy, sparing the (batch, tokens, d_out) multiply. An fp32 run's arithmetic is unchanged
    by the cast (a no-op there), not by the fold."""
    import types

    def forward(self, x):
        h = self.dropout(x) @ self.Q.T  # (..., r0), bf16 under autocast
        if scaled:
            return self.base(x) + (h * (self.lam * self.scaling).to(h.dtype)) @ self.P.T
        return self.base(x) + ((h * self.lam.to(h.dtype)) @ self.P.T) * self.scaling

    for _, layer in handle.layers:
        layer.forward = types.MethodType(forward, layer)


def _compiled(model, handle) -> None:
    """The model's forward (and so its backward) compiled by inductor with CUDA graphs
    (``reduce-overhead``): one replay instead of thousands of launches per step, the cure
    the host-bound profile above asks for. The optimizer step and the allocator stay eager."""
    model.compile(mode="reduce-overhead")


def _autograd_regularizer(model, handle) -> None:
    rule = handle.regularizer
    handle.regularizer = lambda: rule()  # no closed form offered: autograd's gradient


@contextlib.contextmanager
def _unfused():
    """Build the step with torch's default AdamW (foreach) on CUDA too, as before fused."""
    original = torch.optim.AdamW

    def adamw(*args, fused=None, **kwargs):
        return original(*args, **kwargs)

    torch.optim.AdamW = adamw
    try:
        yield
    finally:
        torch.optim.AdamW = original


# name: (method, tweak, unfused AdamW)
VARIANTS = {"adalora-autograd-reg": ("adalora", _autograd_regularizer, False),
            "adalora-unfused": ("adalora", None, True),
            "lora-unfused": ("lora", None, True),
            "adalora-noreg": ("adalora", _no_regularizer, False),
            "adalora-noalloc": ("adalora", _no_allocator, False),
            "adalora-folded": ("adalora", _folded, False),
            "adalora-plain-eq3": ("adalora", _plain_eq3, False),
            "adalora-lamcast": ("adalora", _lam_cast, False),
            "adalora-lamcast-scaled": ("adalora",
                                       lambda m, h: _lam_cast(m, h, scaled=True), False),
            "adalora-compiled": ("adalora", _compiled, False),
            "lora-compiled": ("lora", _compiled, False)}
"""What each part of AdaLoRA's step costs: the regularizer's gradient through autograd
instead of in closed form, torch's default AdamW instead of the fused one (LoRA's too), the
step without the regularizer (Eq. 4) or the allocator's after-step (Eqs. 8-11), Eq. 3's
``lam`` product as autograd's plain multiply (before its autograd function), its diagonal
folded into Q, or ``lam`` cast to the activations' dtype (with or without the
scaling folded into it); and either method with its model compiled under CUDA graphs."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per method")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--shape", choices=["demo", "deberta-v3-base", "bart-large"],
                        default="demo")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--models", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternating rounds timing the variants (0: not timed)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated variants to time beside LoRA and AdaLoRA "
                             f"(default: all of {', '.join(VARIANTS)})")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the full profiler tables (default: not written)")
    args = parser.parse_args()
    chosen = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(VARIANTS)}")
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.shape == "demo":
        rank = args.rank or 4
        setup, batch = demo_setup(rank), real_batch(args.batch or 32)
        what = f"demo (MiniLM), rank {rank}"
    else:
        setup, rank, batch, shape = paper_shape(args.shape, args.rank, args.tiny, args.batch,
                                                args.models)
        what = f"{args.shape}{' (tiny)' * args.tiny}, r0 {rank}, batch {shape}"
    total = 200
    kw = {"setup": setup, "device": device, "precision": args.precision}
    steppers = {m: make_stepper(m, rank, total, batch, **kw) for m in ("adalora", "lora")}
    where = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{what}, {where}, {args.precision}")
    for step in steppers.values():
        step()  # warm-up: allocations, cuBLAS handles
        step()
    if cuda:
        for m, step in steppers.items():
            sites = sync_sites(step)
            print(f"{m}: {sum(sites.values()):g} host syncs per mask-free step")
            for frames, n in sites.most_common():
                print(f"  {n:g} x  " + "\n        <- ".join(frames))
    avgs = {m: profile(step, args.steps, cuda) for m, step in steppers.items()}
    for m in steppers:
        s = summary(avgs[m], args.steps)
        print(f"{m:8s} per step: {s['kernels']:7.0f} kernel launches, GPU kernels "
              f"{s['gpu_us'] / 1000:7.2f} ms, host operators {s['host_us'] / 1000:7.2f} ms")
    print("AdaLoRA minus LoRA per step (count, host ms, GPU ms), largest first:")
    for key, dc, dh, dg in differences(avgs["adalora"], avgs["lora"], args.steps):
        print(f"  {dc:+7.1f} {dh / 1000:+8.3f} {dg / 1000:+8.3f}  {key[:90]}")
    if args.rounds:
        for name in chosen:
            method, tweak, unfused = VARIANTS[name]
            with _unfused() if unfused else contextlib.nullcontext():
                steppers[name] = make_stepper(method, rank, total + 20 * args.rounds, batch,
                                              tweak=tweak, **kw)
        med = alternate(steppers, list(steppers), args.rounds, 5, cuda)
        print(f"median step over {args.rounds} rounds x 5 steps (ratio to LoRA):")
        for m, t in med.items():
            print(f"  {m:22s} {t * 1000:8.1f} ms  {t / med['lora']:.3f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for m, a in avgs.items():
            for sort in ("self_cpu_time_total",) + (("self_cuda_time_total",) if cuda else ()):
                try:
                    text = a.table(sort_by=sort, row_limit=60)
                except (AttributeError, KeyError, ValueError):
                    text = a.table(sort_by="self_device_time_total", row_limit=60)
                (args.out / f"{args.shape}-{m}-{sort}.txt").write_text(text)
        print(f"full tables in {args.out}")


if __name__ == "__main__":
    main()
