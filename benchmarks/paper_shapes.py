"""The paper's two model shapes, random weights, through the real CLI on one device.

Builds DeBERTaV3-base and BART-large folders from their public config.json values with
random weights, stored as the hub stores them (DeBERTa: an fp16 ``pytorch_model.bin``;
BART: fp16 ``model.safetensors``), with the local hub fixture's tokenizers of the same kind
(tests/fixtures/hub: smaller vocabularies, ids all inside the models' vocabularies). Then:

1. DeBERTaV3-base on synthetic MNLI-format pairs of ~60 words each (max_length 128), the
   paper's configs/glue/mnli.yaml with the schedule scaled to ``--steps`` optimizer steps,
   SIGKILLed after half of them (``ADALORA_FAULT=kill@step=N``) and resumed with
   ``adalora train --resume``;
2. BART-large on synthetic XSum-format stories, configs/summarization/xsum.yaml scaled to
   2/3 of ``--steps`` (one batch of 16 per step: grad_accum 1), scored by beam search
   (the config's 8 beams) on 16 stories.

Each CLI run is a subprocess with ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1``. Steps/s come
two ways: summary.json's ``total_steps / train_seconds`` (train_seconds survives a resume
and leaves out the final evaluation), and "seen": this script stamps each metrics.jsonl row
as it appears (polled every 0.05 s) and times the logged steps of one process after its
first few. The eval wall time is the gap between the last training row and the last
evaluation row (it includes the final checkpoint's write).

    python3 benchmarks/paper_shapes.py [--device cuda] [--steps 300] [--out DIR] \
        [--json results.json] [--set train.log_every=10 ...]
    python3 benchmarks/paper_shapes.py --tiny --device cpu     # seconds: checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tests.fixtures.hub (the tokenizers) and adalora_cli
    sys.path.insert(0, str(ROOT))

# microsoft/deberta-v3-base config.json, as published (pos_att_type is the string there)
DEBERTA_V3_BASE: dict[str, Any] = {
    "model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
    "intermediate_size": 3072, "max_position_embeddings": 512, "relative_attention": True,
    "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
    "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "max_relative_positions": -1,
    "position_biased_input": False, "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 0, "vocab_size": 128100}

# facebook/bart-large config.json, as published (task_specific_params included)
BART_LARGE: dict[str, Any] = {
    "_name_or_path": "bart-large", "activation_dropout": 0.1, "activation_function": "gelu",
    "add_bias_logits": False, "add_final_layer_norm": False, "architectures": ["BartModel"],
    "attention_dropout": 0.1, "bos_token_id": 0, "classif_dropout": 0.1,
    "classifier_dropout": 0.0, "d_model": 1024, "decoder_attention_heads": 16,
    "decoder_ffn_dim": 4096, "decoder_layerdrop": 0.0, "decoder_layers": 12,
    "decoder_start_token_id": 2, "dropout": 0.1, "early_stopping": True,
    "encoder_attention_heads": 16, "encoder_ffn_dim": 4096, "encoder_layerdrop": 0.0,
    "encoder_layers": 12, "eos_token_id": 2, "forced_bos_token_id": 0,
    "forced_eos_token_id": 2, "gradient_checkpointing": False,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}, "init_std": 0.02,
    "is_encoder_decoder": True, "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
    "max_position_embeddings": 1024, "model_type": "bart", "no_repeat_ngram_size": 3,
    "normalize_before": False, "num_beams": 4, "num_hidden_layers": 12, "pad_token_id": 1,
    "scale_embedding": False,
    "task_specific_params": {
        "summarization": {"length_penalty": 1.0, "max_length": 128, "min_length": 12,
                          "num_beams": 4},
        "summarization_cnn": {"length_penalty": 2.0, "max_length": 142, "min_length": 56,
                              "num_beams": 4},
        "summarization_xsum": {"length_penalty": 1.0, "max_length": 62, "min_length": 11,
                               "num_beams": 6}},
    "transformers_version": "4.9.0.dev0", "use_cache": True, "vocab_size": 50265}

# --tiny: the same architectures, narrow enough for seconds on a CPU; the real layer counts
# stay, so the number of adapted matrices, and the configs' budgets b(T), are the paper's
TINY_DEBERTA = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
TINY_BART = {"d_model": 32, "decoder_attention_heads": 2, "encoder_attention_heads": 2,
             "decoder_ffn_dim": 64, "encoder_ffn_dim": 64}
# --tiny: smaller batches and sequences too (the busy CPU this is checked on)
TINY_MNLI = ["train.batch_size=8", "task.max_length=64", "train.eval_batch_size=16"]
TINY_XSUM = ["train.batch_size=4", "task.max_length=64", "train.eval_batch_size=16"]

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
MNLI_LABELS = ("entailment", "neutral", "contradiction")


def say(*parts: Any) -> None:
    print(*parts, flush=True)


# ------------------------------------------------------------------ model folders

def _tokenizer_files(kind: str) -> dict[str, bytes]:
    """The local hub fixture's tokenizer files for that repo, built in memory (seconds)."""
    if kind == "deberta":
        from tests.fixtures.hub.tokenizer_files import deberta_v3
        return deberta_v3()
    from tests.fixtures.hub.specs_paper import bart_tokenizer
    return bart_tokenizer()


def _write_folder(folder: Path, config: dict, arch: str, layout: str,
                  tokenizer: dict[str, bytes]) -> Path:
    """Random ``arch`` weights from ``config``, stored fp16 as ``layout`` (bin or
    safetensors), the config.json as given (not transformers' re-serialization, which
    would add a dtype the hub's file lacks), and the tokenizer files."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(loaded)
    # fp16, each tied weight cast once (the MLM decoder shares the embedding)
    cast: dict[int, torch.Tensor] = {}
    state, unique = {}, {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in cast:
            cast[tensor.data_ptr()] = unique[name] = tensor.to(torch.float16).contiguous()
        state[name] = cast[tensor.data_ptr()]
    if layout == "bin":  # torch.save keeps the sharing: the tie is stored once, as the hub's
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        # safetensors refuses shared tensors: the first name only; transformers re-ties
        save_file(unique, folder / "model.safetensors", metadata={"format": "pt"})
    for name, data in tokenizer.items():
        (folder / name).write_bytes(data)
    (folder / "BUILT").write_text("ok\n")  # written last: a half-built folder is redone
    return folder


def build_deberta(folder: str | Path, tiny: bool = False) -> Path:
    """A DeBERTaV3-base folder (DebertaV2ForMaskedLM, fp16 pytorch_model.bin, as the hub
    stores it); ``tiny``: width 32 and a vocabulary of the tokenizer's size."""
    folder = Path(folder)
    if (folder / "BUILT").exists():
        return folder
    tok = _tokenizer_files("deberta")
    config = dict(DEBERTA_V3_BASE)
    if tiny:
        import sentencepiece as spm
        pieces = spm.SentencePieceProcessor(model_proto=tok["spm.model"]).get_piece_size()
        config.update(TINY_DEBERTA, vocab_size=pieces + 100)
    return _write_folder(folder, config, "DebertaV2ForMaskedLM", "bin", tok)


def build_bart(folder: str | Path, tiny: bool = False) -> Path:
    """A BART-large folder (BartModel, fp16 model.safetensors as the hub's); ``tiny``: width
    32 and the tokenizer's vocabulary."""
    folder = Path(folder)
    if (folder / "BUILT").exists():
        return folder
    tok = _tokenizer_files("bart")
    config = dict(BART_LARGE)
    if tiny:
        config.update(TINY_BART, vocab_size=len(json.loads(tok["vocab.json"])))
    return _write_folder(folder, config, "BartModel", "safetensors", tok)


# ------------------------------------------------------------------ synthetic data

def write_mnli(folder: Path, train: int, evals: int, sentences: int = 6) -> Path:
    """MNLI's local layout (tests/fixtures/glue/mnli): train / validation_matched /
    validation_mismatched .json lists of {premise, hypothesis, label name, idx}; ~10 words
    a sentence, so 6 sentences a side fill 128 tokens."""
    from tests.fixtures.hub.text import Writer

    w = Writer(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("validation_matched", evals),
                     ("validation_mismatched", evals)):
        rows = [{"premise": w.document(sentences), "hypothesis": w.document(sentences),
                 "label": MNLI_LABELS[w.label(3)], "idx": i} for i in range(n)]
        (folder / f"{split}.json").write_text(json.dumps(rows, indent=1))
    return folder


def write_xsum(folder: Path, train: int, evals: int, sentences: int) -> Path:
    """XSum's local layout (tests/fixtures/summarization/xsum): train / validation .jsonl of
    {document, summary, id}."""
    from tests.fixtures.hub.text import Writer

    w = Writer(1)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("validation", evals)):
        with open(folder / f"{split}.jsonl", "w") as f:
            for i in range(n):
                row = {"document": w.document(sentences), "summary": w.sentence(),
                       "id": str(30_000_000 + i)}
                f.write(json.dumps(row) + "\n")
    return folder


# ------------------------------------------------------------------ running the CLI

class Watch:
    """Stamps each new metrics.jsonl row with the time it was first seen."""

    def __init__(self, path: Path):
        self.path = path
        self.base = max((r.get("step", 0) for r in self._rows() if "split" not in r),
                        default=0)  # rows of an earlier attempt are not this process's
        self.train: dict[int, float] = {}
        self.evals: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rows(self) -> list[dict]:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return rows

    def poll(self) -> None:
        now = time.perf_counter()
        for row in self._rows():
            step = row.get("step", 0)
            if "split" in row:
                key = (step, row["split"])
                if step > self.base and key not in {(r["step"], r["split"])
                                                    for _, r in self.evals}:
                    self.evals.append((now, row))
            elif step > self.base and step not in self.train:
                self.train[step] = now

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.poll()

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def steps_per_second(self, skip: int = 5) -> float | None:
        """Logged steps per second, leaving out this process's first ``skip`` steps
        (start-up: allocator, kernel caches)."""
        first, last = min(self.train, default=0), max(self.train, default=0)
        skip = min(skip, (last - first) // 3)  # a short (--tiny) run keeps most of its steps
        steps = [s for s in sorted(self.train) if s >= first + skip]
        if len(steps) < 2 or self.train[steps[-1]] <= self.train[steps[0]]:
            return None
        return (steps[-1] - steps[0]) / (self.train[steps[-1]] - self.train[steps[0]])

    def eval_seconds(self) -> float | None:
        if not self.evals or not self.train:
            return None
        return self.evals[-1][0] - max(self.train.values())


def cli(args: list[str], run_dir: Path, fault: str | None = None) -> dict[str, Any]:
    """One ``adalora train`` subprocess; its exit code, wall time, output tail and what
    the metrics watch saw."""
    env = {**os.environ, **OFFLINE}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("ADALORA_FAULT", None)
    if fault:
        env["ADALORA_FAULT"] = fault
    cmd = [sys.executable, "-m", "adalora_cli", "train", *args, "--quiet"]
    say("  $", ("ADALORA_FAULT=" + fault + " ") if fault else "", " ".join(cmd[2:]))
    start = time.perf_counter()
    with Watch(run_dir / "metrics.jsonl") as watch:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    out = (proc.stdout + proc.stderr).strip().splitlines()
    result = {"rc": proc.returncode, "wall_s": round(wall, 2),
              "seen_steps_per_s": _round(watch.steps_per_second()),
              "seen_steps": [min(watch.train, default=None), max(watch.train, default=None)],
              "eval_s": _round(watch.eval_seconds()), "tail": out[-6:]}
    say(f"    rc {_rc(proc.returncode)}, {wall:.1f} s wall; steps seen "
        f"{result['seen_steps'][0]}..{result['seen_steps'][1]} at "
        f"{result['seen_steps_per_s']} steps/s")
    for line in out[-6:]:
        say("    |", line[:160])
    return result


def _rc(code: int) -> str:
    return f"{code} (SIGKILL)" if code == -9 else str(code)


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def outcome(run_dir: Path) -> dict[str, Any]:
    """What the run directory says: status, steps, timings, memory, precision, metrics."""
    status = json.loads((run_dir / "status.json").read_text()) if (
        run_dir / "status.json").exists() else {}
    summary = json.loads((run_dir / "summary.json").read_text()) if (
        run_dir / "summary.json").exists() else {}
    steps, secs = summary.get("total_steps"), summary.get("train_seconds")
    return {"status": status.get("status"), "attempts": status.get("attempt", 1),
            "total_steps": steps, "train_seconds": secs,
            "summary_steps_per_s": _round(steps / secs) if steps and secs else None,
            "peak_memory_bytes": summary.get("peak_memory_bytes"),
            "peak_memory_gib": _round((summary.get("peak_memory_bytes") or 0) / 2**30, 3),
            "precision": summary.get("precision"), "metrics": summary.get("metrics"),
            "final_mean_rank": summary.get("final_mean_rank"),
            "device": summary.get("device"), "data": summary.get("data")}


def schedule(total: int, t_init: float, t_final: float, warmup: float) -> list[str]:
    """AdaLoRA's phases as fractions of T (the paper's t_i/T, t_f/T, warm-up/T), with a mask
    every T/30 steps so that the budget really anneals over the middle phase."""
    return [f"train.max_steps={total}", f"adalora.t_init={round(t_init * total)}",
            f"adalora.t_final={round(t_final * total)}",
            f"adalora.delta_t={max(1, total // 30)}",
            f"train.warmup_steps={max(1, round(warmup * total))}"]


def run_mnli(model: Path, data: Path, runs: Path, args: argparse.Namespace) -> dict:
    total = args.steps
    kill_at, save_every = total // 2, max(1, total // 3)
    run_dir = runs / "mnli"
    # paper T = 85,904: t_i 8,000, t_f 50,000, warm-up 1,000
    overrides = [f"model.name_or_path={model}", f"task.data_dir={data}",
                 "task.max_length=128", f"train.device={args.device}",
                 *(TINY_MNLI if args.tiny else []),
                 *schedule(total, 8000 / 85904, 50000 / 85904, 1000 / 85904),
                 f"train.save_every={save_every}", "train.eval_every=null", *args.set]
    say(f"[mnli] DeBERTaV3-base, T={total}, kill after step {kill_at}, "
        f"checkpoint every {save_every}")
    killed = cli(["configs/glue/mnli.yaml", *overrides, "--run-dir", str(run_dir)],
                 run_dir, fault=f"kill@step={kill_at}")
    resumed = cli(["--resume", str(run_dir)], run_dir)
    return {"killed": killed, "resumed": resumed, **outcome(run_dir)}


def run_xsum(model: Path, data: Path, runs: Path, args: argparse.Namespace) -> dict:
    total = max(3, round(args.steps * 2 / 3))
    run_dir = runs / "xsum"
    # paper T = 79,725: t_i 6,000, t_f 50,000, warm-up 3,000; b(T) 1536 and 8 beams kept
    overrides = [f"model.name_or_path={model}", f"task.data_dir={data}",
                 f"train.device={args.device}", "train.grad_accum=1",
                 *(TINY_XSUM if args.tiny else []),
                 *schedule(total, 6000 / 79725, 50000 / 79725, 3000 / 79725),
                 "task.max_eval_samples=16", f"task.generation_max_length={args.gen_len}",
                 "train.eval_every=null", *args.set]
    say(f"[xsum] BART-large, T={total}, beam search on 16 stories, "
        f"{args.gen_len} new tokens at most")
    run = cli(["configs/summarization/xsum.yaml", *overrides, "--run-dir", str(run_dir)],
              run_dir)
    return {"run": run, **outcome(run_dir)}


def report(name: str, r: dict) -> None:
    say(f"== {name}")
    for key in ("killed", "resumed", "run"):
        if key in r:
            say(f"  {key:8s} rc {_rc(r[key]['rc'])}  wall {r[key]['wall_s']} s  "
                f"seen {r[key]['seen_steps_per_s']} steps/s")
    say(f"  status {r['status']} after {r['attempts']} attempt(s), device {r['device']}")
    say(f"  steps/s {r['summary_steps_per_s']} (summary: {r['total_steps']} steps / "
        f"{r['train_seconds']} s train_seconds)")
    say(f"  peak memory {r['peak_memory_bytes']} B ({r['peak_memory_gib']} GiB)")
    say(f"  precision {json.dumps(r['precision'])}")
    say(f"  final mean rank {r['final_mean_rank']}; metrics {json.dumps(r['metrics'])}")
    ev = r.get("run", r.get("resumed", {})).get("eval_s")
    say(f"  final evaluation ~{ev} s wall (last train row -> last eval row)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="default: cuda when available")
    parser.add_argument("--tiny", action="store_true", help="tiny widths: a CPU check")
    parser.add_argument("--out", type=Path, default=None,
                        help="folders, data and runs (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    parser.add_argument("--steps", type=int, default=None,
                        help="MNLI optimizer steps T (XSum: 2/3 of it); default 300, "
                             "tiny 12")
    parser.add_argument("--gen-len", type=int, default=None,
                        help="XSum: most new tokens per summary (default 32, tiny 12)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for both runs (repeatable)")
    parser.add_argument("--only", choices=["mnli", "xsum"], default=None)
    args = parser.parse_args()
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.steps = args.steps or (12 if args.tiny else 300)
    args.gen_len = args.gen_len or (12 if args.tiny else 32)
    if args.steps < 6:
        parser.error("--steps must be >= 6 (a kill at T/2 after a checkpoint at T/3)")
    out = args.out or Path(tempfile.mkdtemp(prefix="paper-shapes-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = out / f"runs-{time.strftime('%Y%m%d-%H%M%S')}"
    say(f"paper shapes ({'tiny' if args.tiny else 'full size'}) on {args.device}, "
        f"T={args.steps}, out {out}")
    started = time.perf_counter()
    results: dict[str, Any] = {"device": args.device, "tiny": args.tiny,
                               "steps": args.steps, "out": str(out), "timings_s": {}}

    def timed(label: str, fn, *a):
        t = time.perf_counter()
        value = fn(*a)
        results["timings_s"][label] = round(time.perf_counter() - t, 2)
        say(f"[{time.perf_counter() - started:6.1f} s] {label}: "
            f"{results['timings_s'][label]} s")
        return value

    suffix = "-tiny" if args.tiny else ""
    if args.only in (None, "mnli"):
        deberta = timed("build deberta-v3-base", build_deberta,
                        out / f"deberta-v3-base{suffix}", args.tiny)
        n_train = 64 if args.tiny else 2400  # 75 steps an epoch of 32: several epochs
        mnli = timed("write mnli data", write_mnli, out / f"mnli{suffix}", n_train,
                     16 if args.tiny else 256, 3 if args.tiny else 6)
        results["mnli"] = timed("mnli kill + resume", run_mnli, deberta, mnli, runs, args)
        report("DeBERTaV3-base / MNLI (kill + resume)", results["mnli"])
    if args.only in (None, "xsum"):
        bart = timed("build bart-large", build_bart, out / f"bart-large{suffix}", args.tiny)
        xsum = timed("write xsum data", write_xsum, out / f"xsum{suffix}",
                     64 if args.tiny else 1024, 16, 4 if args.tiny else 20)
        results["xsum"] = timed("xsum train + beam eval", run_xsum, bart, xsum, runs, args)
        report("BART-large / XSum (beam search eval)", results["xsum"])
    results["timings_s"]["total"] = round(time.perf_counter() - started, 2)
    say(f"total {results['timings_s']['total']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        say(f"numbers: {args.json}")
    ok = all(r.get("status") == "finished" for k, r in results.items()
             if k in ("mnli", "xsum"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
