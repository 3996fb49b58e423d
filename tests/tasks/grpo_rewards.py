"""Reward functions the GRPO tests name with --reward (module:function), as a user's own module would be."""

from __future__ import annotations

import math


def letters(completions, **kwargs):
    """A tenth of each completion's length in characters: differs between completions of a tiny random model."""
    return [len(c) / 10 for c in completions]


def cats(completions, **kwargs):
    return [float(str(c).count("cat")) for c in completions]


def one_short(completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def not_a_number(prompts, completions, **kwargs):
    return [math.nan if i == 2 else 1.0 for i in range(len(completions))]


def raises(completions, **kwargs):
    return {"reward": 1.0}[completions[0]]


def chat_letters(prompts, completions, **kwargs):
    """As `letters`, for chats: each prompt a list of messages, each completion the assistant's message."""
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in completions)
    return [len(c[0]["content"]) / 10 for c in completions]
