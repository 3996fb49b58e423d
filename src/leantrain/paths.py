"""Where leantrain and the Hugging Face libraries keep what they download and cache (`leantrain env`)."""

from __future__ import annotations


def cache_paths() -> list[tuple[str, str]]:
    """(name, "path  (what; the variable that moves it)") for each cache a run fills."""
    from huggingface_hub import constants

    from leantrain.data.tokenize import default_cache_dir

    rows = [
        ("leantrain cache", f"{default_cache_dir()}  (tokenized data, CPU peak probe; $LEANTRAIN_CACHE)"),
        ("hub cache", f"{constants.HF_HUB_CACHE}  (downloaded models; $HF_HUB_CACHE or $HF_HOME)"),
    ]
    try:
        from datasets import config as datasets_config

        rows.append(("datasets cache", f"{datasets_config.HF_DATASETS_CACHE}  (hub data sets; $HF_DATASETS_CACHE)"))
    except ImportError:
        pass
    return rows
