#!/usr/bin/env bash
# The GPU check, in one prepared call on a lent GPU machine (the `device` tool), under eight minutes:
#   leantrain env, then `leantrain bench`'s technique matrix and MFU for BERT-base (random weights, built from
#   BertConfig) at sequence length 128, bf16 and fp16, micro-batches 32-256. Results land in $OUT:
#   env.txt, gpu_check.md (summary, MFU goal), bench.md/.csv/.json/.png, log.txt; commit them to
#   benchmarks/results/gpu_check/.
#
#   device run:  bash benchmarks/gpu_check.sh            (timeout_s 540)
#   here (tests the script on a tiny model, CPU):  OUT=/tmp/gpu bash benchmarks/gpu_check.sh --smoke
#
# The GPU image has torch, transformers, accelerate, tokenizers, pandas, scikit-learn, rich, matplotlib and
# pyyaml but not `datasets` nor bitsandbytes; leantrain runs from src/ without installing, and its CSV path
# needs neither (the adamw8bit row reports bitsandbytes missing unless its wheel is carried in .whl/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then  # wheels carried for packages the image lacks (device README)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PY" -m leantrain env
} 2>&1 | tee "$OUT/env.txt"
"$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
