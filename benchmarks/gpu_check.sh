#!/usr/bin/env bash
# The GPU check, in one prepared call on a lent GPU machine (the `device` tool), under nine minutes: leantrain env,
# then benchmarks/gpu_check.py (see its docstring): packed attention per implementation, BERT-base's technique
# matrix and MFU, the causal LM's bench, and profiles, within a time budget (--budget, most valuable first).
# Results land in $OUT: env.txt, gpu_check.md (everything on one page), log.txt, and with --pack results.tar.gz
# (tables, charts, JSON, profile summaries) and traces.tar.gz (profiler traces); unpack them into
# benchmarks/results/gpu_check/ and commit.
#
#   device run:  bash benchmarks/gpu_check.sh --pack [--lm-vs-hf] [--attention-from FILE]   (timeout_s 540)
#   the host's cost alone (syncs per step, compile with buckets and CUDA graphs, Liger, the HF Trainer on the
#   same jobs; benchmarks/gpu_host.py), under eight minutes:  bash benchmarks/gpu_check.sh --host-only --pack
#   (timeout_s 480; carry Liger's wheel in .whl/ when the image lacks it: pip download liger-kernel --no-deps -d .whl);
#   BERT-base's rows alone fill most of it: a second call with --host-models llama (or --host-runs NAME,NAME) does the rest
#   here (tests the script on tiny models, CPU):  OUT=/tmp/gpu bash benchmarks/gpu_check.sh --smoke --pack
#
# The GPU image has torch, transformers, accelerate, peft, tokenizers, pandas, scikit-learn, rich, matplotlib and
# pyyaml but not `datasets`, ftfy nor bitsandbytes; leantrain runs from src/ without installing, and its CSV path
# needs none of them (checked here with them made unimportable).
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
