#!/usr/bin/env bash
# Install leantrain with its test extras into .venv, then run the test suite.
# The CPU torch wheel is installed first and pinned: a bare `torch` requirement would pull a
# several-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
# (pip's "Location ... is ignored" lines come from this machine's extra index settings: noise)
pipq() { python -m pip install -q "$@" 2> >(grep -v "is ignored" >&2); }
pipq "torch==2.13.0"
pipq -e ".[dev]"
export HF_HUB_OFFLINE=1
python -m pytest "$@"
