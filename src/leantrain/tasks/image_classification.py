"""Image classification: a folder per class, a table of paths or IDX files; pixels processed once, cached."""

from __future__ import annotations

from typing import ClassVar

from leantrain.tasks.media_classification import MediaClassification


class ImageClassification(MediaClassification):
    name: ClassVar[str] = "image-classification"
    plain_folder: ClassVar[str] = "image"
    input_names: ClassVar[tuple[str, ...]] = ("pixel_values",)
    auto_model: ClassVar[str] = "AutoModelForImageClassification"
    model_mapping: ClassVar[str] = "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"
    architectures: ClassVar[tuple[str, ...]] = ("ImageClassification",)
    pipeline: ClassVar[str] = "image-classification"
