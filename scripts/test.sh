#!/usr/bin/env bash
# Install leantrain with its test extras into .venv, then run the test suite.
# The CPU torch wheel is installed first and pinned: a bare `torch` requirement would pull a
# several-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev]"
export HF_HUB_OFFLINE=1
python -m pytest "$@"
