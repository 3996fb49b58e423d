#!/usr/bin/env bash
# Install leantrain into .venv and run the default job: MiniLM fine-tuned on the embedded
# tweet-sentiment corpus (about five minutes on two CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e .
HF_HUB_OFFLINE=1 leantrain train "$@"
