#!/usr/bin/env bash
# Install leantrain into .venv and run the default job: MiniLM fine-tuned on the embedded
# tweet-sentiment corpus (about five minutes on two CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
# (pip's "Location ... is ignored" lines come from this machine's extra index settings: noise)
pipq() { python -m pip install -q "$@" 2> >(grep -v "is ignored" >&2); }
pipq "torch==2.13.0"
pipq -e .
HF_HUB_OFFLINE=1 leantrain train "$@"
