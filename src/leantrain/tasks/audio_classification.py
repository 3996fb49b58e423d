"""Audio classification: WAV folders or tables; resampled, padded or cut, features computed once, cached."""

from __future__ import annotations

from typing import ClassVar

from leantrain.tasks.media_classification import MediaClassification


class AudioClassification(MediaClassification):
    name: ClassVar[str] = "audio-classification"
    plain_folder: ClassVar[str] = "audio"
    input_names: ClassVar[tuple[str, ...]] = ("input_values", "input_features", "attention_mask")
    auto_model: ClassVar[str] = "AutoModelForAudioClassification"
    model_mapping: ClassVar[str] = "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"
    architectures: ClassVar[tuple[str, ...]] = ("AudioClassification",)
    pipeline: ClassVar[str] = "audio-classification"
