"""Small built-in models to train from scratch: `--model preset:tiny-vit`, `preset:tiny-audio`, `preset:tiny-llama`.

Each preset is a Transformers config plus the processor that prepares its inputs, so a model can be
trained with no pretrained checkpoint and no network. The trained run saves both, like any model.
"""

from __future__ import annotations

from typing import Any

from leantrain.errors import ModelError

PREFIX = "preset:"

#: name -> (task, one-line description)
PRESETS: dict[str, tuple[str, str]] = {
    "tiny-vit": (
        "image-classification",
        "ViT, 32x32 RGB input in 8x8 patches (16 patches), 4 layers, hidden 128 (0.6 M parameters)",
    ),
    "tiny-audio": (
        "audio-classification",
        "Audio Spectrogram Transformer, 64 mel bins at 16 kHz, 16x16 patches (stride 16 in frequency, 8 in time: "
        "44 patches a second), 4 layers, hidden 128 (0.6 M parameters); --max-seconds sets its input length "
        "(default 1 s)",
    ),
    "tiny-llama": (
        "causal-lm",
        "Llama, 4 layers, hidden 256, 4 heads, feed-forward 688, tied embeddings, positions up to 1024 (about 5 M "
        "parameters with its 8192-token byte-level BPE, which the run trains on its own training text, and a plain "
        "'role: content' chat template)",
    ),
}

DEFAULT_AUDIO_SECONDS = 1.0


def is_preset(name: str | None) -> bool:
    return bool(name) and str(name).startswith(PREFIX)


def _name(name: str) -> str:
    short = name[len(PREFIX) :]
    if short not in PRESETS:
        known = ", ".join(PREFIX + k for k in PRESETS)
        raise ModelError(f"--model {name}: no such preset; known presets: {known}")
    return short


def preset_task(name: str) -> str:
    return PRESETS[_name(name)][0]


def fbank_frames(seconds: float, sampling_rate: int = 16000) -> int:
    """Frames of a Kaldi filter bank (25 ms windows every 10 ms, edges snipped) over `seconds` of audio."""
    samples = round(seconds * sampling_rate)
    window, shift = round(0.025 * sampling_rate), round(0.010 * sampling_rate)
    return max(1, 1 + (samples - window) // shift)


def preset_config(name: str, max_seconds: float | None = None, **overrides: Any):
    """The preset's model config (with `overrides` such as num_labels, id2label applied)."""
    short = _name(name)
    config: Any
    if short == "tiny-vit":
        from transformers import ViTConfig

        config = ViTConfig(
            image_size=32,
            patch_size=8,
            num_channels=3,
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=256,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    elif short == "tiny-llama":
        from transformers import LlamaConfig

        config = LlamaConfig(
            vocab_size=8192,  # the run's tokenizer sets the real size
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            attention_dropout=0.0,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
            architectures=["LlamaForCausalLM"],
        )
    else:
        from transformers import ASTConfig

        config = ASTConfig(
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=256,
            patch_size=16,
            frequency_stride=16,
            time_stride=8,
            num_mel_bins=64,
            max_length=fbank_frames(max_seconds or DEFAULT_AUDIO_SECONDS),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    config._name_or_path = name
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def preset_processor(name: str, max_seconds: float | None = None):
    """The image processor or feature extractor that matches the preset's config."""
    short = _name(name)
    if short == "tiny-vit":
        from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

        return ViTImageProcessorPil(
            size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=2
        )
    from transformers import ASTFeatureExtractor

    return ASTFeatureExtractor(
        num_mel_bins=64, max_length=fbank_frames(max_seconds or DEFAULT_AUDIO_SECONDS), sampling_rate=16000
    )
