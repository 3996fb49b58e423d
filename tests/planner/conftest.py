"""Fixtures of the planner's tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def without_lora_notes(monkeypatch) -> None:
    """The plan's LoRA note left out: three or four more estimates on LoRA proxies, a third to a half of a small plan's
    time, for tests whose claims are not about it. `test_search.py` checks the note; the other plans of the suite
    (the seq2seq probe and --auto tests among them) still write it."""
    from leantrain.planner import search

    monkeypatch.setattr(search, "lora_notes", lambda request, facts: [])
