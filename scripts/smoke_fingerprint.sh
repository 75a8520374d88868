#!/usr/bin/env bash
# The smoke runs' fingerprint: sha256 of the files that must stay byte-identical across a
# change that promises no behaviour change (metrics.jsonl, rank_pattern.json, the adapter
# weights). Run it before and after, and diff the two outputs:
#
#   scripts/smoke_fingerprint.sh /tmp/before > before.txt   # on the old commit
#   scripts/smoke_fingerprint.sh /tmp/after  > after.txt    # on the new one
#   diff before.txt after.txt
#
# One thread, so float reductions run in one order. ADALORA (the command) may be overridden,
# e.g. ADALORA="python -m adalora_cli" with PYTHONPATH pointing at another checkout.
set -euo pipefail
out="${1:?usage: scripts/smoke_fingerprint.sh OUT_DIR}"
adalora="${ADALORA:-.venv/bin/adalora}"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
rm -rf "$out"; mkdir -p "$out"
run() {  # name config [overrides...]
  local name=$1 config=$2; shift 2
  $adalora train "$config" "$@" --run-dir "$out/$name" --quiet > "$out/$name.log" 2>&1 \
    || { echo "smoke run $name failed; see $out/$name.log" >&2; exit 1; }
}
run glue-adalora configs/smoke/glue.yaml
run glue-lora configs/smoke/glue.yaml method.name=lora lora.r=2
run squad configs/smoke/squad.yaml
run summarization configs/smoke/summarization.yaml
cd "$out"
for f in */metrics.jsonl */rank_pattern.json */adapter_model.safetensors; do
  [ -e "$f" ] && sha256sum "$f"
done
