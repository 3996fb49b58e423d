"""Runs at start-up in every process of a test's subprocess job (tests/hooks.py `site_env`): makes
`leantrain.train` use the hooks the LT_TEST_* variables describe."""

import os
import sys

if any(k.startswith("LT_TEST_") for k in os.environ):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.hooks import install_from_environment

    install_from_environment()
