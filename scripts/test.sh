#!/usr/bin/env bash
# Install leantrain with its test extras into .venv, then run the test suite.
# scripts/install.sh installs the torch that fits the machine first (CPU build where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh ".[dev]"
# The report test opens report.html in headless Chromium (skipped without it). Install it where we can.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && [ -z "${LEANTRAIN_NO_BROWSER:-}" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "chromium not installed: the browser test will be skipped" >&2
fi
export HF_HUB_OFFLINE=1
# Lint, format and type checks (settings in pyproject.toml; .pre-commit-config.yaml runs the same)
ruff check src tests scripts benchmarks
ruff format --check src tests scripts benchmarks
mypy
# The documentation site builds without warnings (broken links, missing pages); about 8 s
NO_MKDOCS_2_WARNING=1 mkdocs build --strict -q -d "$(mktemp -d)"
# Tests run in one worker per CPU, at most 4 (pytest-xdist; each worker's OpenMP threads are its share of the
# CPUs: tests/conftest.py): on 2 cores they overlap one test's imports, start-up and process launches with
# another's compute (times in CONTRIBUTING.md). LEANTRAIN_TEST_WORKERS=0 runs the tests in this one process.
workers=${LEANTRAIN_TEST_WORKERS:-$(python -c "import os; n = min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1); print(n if n > 1 else 0)")}
# Coverage of the leantrain package; the floor is [tool.coverage.report] fail_under in pyproject.toml
# --durations: the slowest tests, printed in every CI log, for keeping the suite within its time
python -m pytest -n "$workers" --dist worksteal --cov=leantrain --cov-report=term --durations=30 "$@"
