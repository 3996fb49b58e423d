"""Runs at start-up in every process of a test's subprocess job (tests/hooks.py `site_env`): makes
`leantrain.train` use the hooks the LT_TEST_* variables describe."""

import os
import sys

if any(k.startswith("LT_TEST_") for k in os.environ):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.hooks import from_environment

    import leantrain.api as api

    _train = api.train

    def train(config=None, *, task=None, hooks=None, **overrides):
        return _train(config, task=task, hooks=hooks or from_environment(), **overrides)

    api.train = train
