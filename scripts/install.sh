# Sourced by quickstart.sh and test.sh: create and activate .venv, install the pinned CPU torch
# first (a bare `torch` requirement would pull a several-GB CUDA build), then leantrain with the
# extras given as $1 (e.g. ".[dev]"; default ".").
python3 -m venv .venv
. .venv/bin/activate
# (pip's "Location ... is ignored" lines come from this machine's extra index settings: noise)
pipq() { python -m pip install -q "$@" 2> >(grep -v "is ignored" >&2); }
pipq "torch==2.13.0"
pipq -e "${1:-.}"
