"""Images and audio, from a folder or table to processed train/eval sets: read, label, process once, cache.

Sources:
  - a folder of files, one sub-folder per class (like `datasets`' imagefolder/audiofolder), or with the
    label taken from each file's path by `--label-pattern` (a regular expression);
  - a CSV/TSV/JSON/JSONL/Parquet table or a `save_to_disk` folder with an image/audio column (paths,
    relative to the table's folder, or `datasets` Image/Audio values) and a label column;
  - for images, a folder of IDX files (the MNIST format).

The processor (AutoImageProcessor / AutoFeatureExtractor, or a preset's) prepares every example once;
the result is cached like tokenized text (keyed by the files, the processor's definition and the
settings). Unreadable files are skipped and counted, or stop the run with --strict.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from leantrain.data import audio as audio_mod
from leantrain.data import images as image_mod
from leantrain.data.sources import TABLE_SUFFIXES, ReadOptions, ReadReport, read_options
from leantrain.data.split import beyond_limit
from leantrain.data.tokenize import cache_key, source_fingerprint
from leantrain.errors import ConfigError, DataError, ModelError
from leantrain.telemetry.console import counted

if TYPE_CHECKING:  # the config sits above the data layer: its sections are only named here
    from leantrain.config.sections import DataConfig

log = logging.getLogger("leantrain")

IMAGE, AUDIO = "image-classification", "audio-classification"
INPUTS_FILE = "leantrain_inputs.json"  # saved next to the processor: what predict needs to prepare inputs alike
IMAGE_COLUMNS = ("image", "img", "image_path", "image_file", "path", "file", "filename", "filepath", "file_path")
AUDIO_COLUMNS = ("audio", "audio_path", "audio_file", "wav", "path", "file", "filename", "filepath", "file_path")
CHUNK = 512
MAX_AUTO_SECONDS = 30.0
#: bump when decoding changes what is stored (2: 16-bit grey images scaled, not clipped; EXIF orientation applied;
#: truncated WAVs dropped; 3: IDX floats and wide integers scaled or refused, not cast; RGBA keeps RGB, not red;
#: 4: clips with NaN or infinite samples dropped; 5: float clips at integer scale dropped)
MEDIA_CACHE_VERSION = 5


def kind(task: str) -> str:
    return "image" if task == IMAGE else "audio"


# --- the processor ----------------------------------------------------------------------------------


@dataclass
class MediaProcessor:
    """The model's image processor or feature extractor, plus the settings that shape its inputs."""

    task: str
    processor: Any
    channels: int = 3  # images: 1 (grey) or 3 (RGB), from the model's config
    resizes: bool = True  # images: False when the model came without a processor (sizes must match)
    image_size: list[int] | None = None  # images: the size the model takes, when it does not resize
    max_seconds: float | None = None  # audio: pad or cut to this (None: decided from the training data)

    @property
    def sampling_rate(self) -> int:
        return int(self.processor.sampling_rate)

    def settings(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "channels": self.channels,
            "resizes": self.resizes,
            "image_size": self.image_size,
            "max_seconds": self.max_seconds,
        }

    def fingerprint(self) -> str:
        h = hashlib.sha256(type(self.processor).__name__.encode())
        h.update(self.processor.to_json_string().encode())
        h.update(json.dumps(self.settings(), sort_keys=True).encode())
        return h.hexdigest()

    def save_pretrained(self, path: str | Path) -> None:
        self.processor.save_pretrained(str(path))
        (Path(path) / INPUTS_FILE).write_text(json.dumps(self.settings(), indent=2) + "\n")


def load_processor(name: str, config, task: str, max_seconds: float | None = None) -> MediaProcessor:
    """The processor of a preset, model folder (or a config.json's folder) or hub model; a plain one when
    a local model has none (images then must already have the model's size)."""
    from leantrain.model import presets

    channels = int(getattr(config, "num_channels", 3) or 3)
    if presets.is_preset(name):
        seconds = max_seconds or (presets.DEFAULT_AUDIO_SECONDS if task == AUDIO else None)
        return MediaProcessor(task, presets.preset_processor(name, seconds), channels, max_seconds=seconds)
    path = Path(name)
    folder = path.parent if path.is_file() else path
    saved: dict[str, Any] = {}
    if (folder / INPUTS_FILE).is_file():
        saved = json.loads((folder / INPUTS_FILE).read_text())
    processor = _auto_processor(name, folder, task) if folder.is_dir() or not path.exists() else None
    if processor is None:
        processor = _plain_processor(config, task, name)
        resizes = False
    else:
        resizes = bool(saved.get("resizes", True))
    if saved.get("task", task) != task:
        raise ModelError(f"{name}: its processor was saved for {saved['task']}, not {task}")
    size = getattr(config, "image_size", None)
    mp = MediaProcessor(
        task,
        processor,
        int(saved.get("channels", channels)),
        resizes,
        saved.get("image_size") or ([int(size), int(size)] if isinstance(size, int) else None),
        max_seconds or saved.get("max_seconds"),
    )
    if task == AUDIO and mp.max_seconds is None:
        mp.max_seconds = audio_mod.native_seconds(processor)
    return mp


def _auto_processor(name: str, folder: Path, task: str):
    """AutoImageProcessor/AutoFeatureExtractor from a folder that has one (or a hub name); None otherwise."""
    import warnings

    from transformers import AutoFeatureExtractor, AutoImageProcessor

    local = folder.is_dir()
    if local and not (folder / "preprocessor_config.json").is_file():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if task == IMAGE:  # the Pillow backend: numpy in, uint8 out, with or without torchvision installed
                return AutoImageProcessor.from_pretrained(str(folder) if local else name, backend="pil")
            return AutoFeatureExtractor.from_pretrained(str(folder) if local else name)
    except (OSError, ValueError) as exc:
        what = "image processor" if task == IMAGE else "feature extractor"
        raise ModelError(f"{name}: cannot load its {what} ({str(exc).splitlines()[0][:160]})") from None


def _plain_processor(config, task: str, name: str):
    """For a model without a saved processor: no resizing for images; the config's own features for audio."""
    if task == IMAGE:
        from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

        c = int(getattr(config, "num_channels", 3) or 3)
        return ViTImageProcessorPil(do_resize=False, image_mean=[0.5] * c, image_std=[0.5] * c)
    model_type = getattr(config, "model_type", "")
    if model_type == "audio-spectrogram-transformer":
        from transformers import ASTFeatureExtractor

        return ASTFeatureExtractor(num_mel_bins=config.num_mel_bins, max_length=config.max_length)
    if model_type == "whisper":
        from transformers import WhisperFeatureExtractor

        return WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    if model_type in ("wav2vec2", "hubert", "wavlm", "data2vec-audio", "sew", "sew-d", "unispeech", "unispeech-sat"):
        from transformers import Wav2Vec2FeatureExtractor

        return Wav2Vec2FeatureExtractor(sampling_rate=16000, do_normalize=True)
    raise ModelError(
        f"{name}: no feature extractor saved with this '{model_type}' model and none known to build from its "
        "config; save one next to config.json (AutoFeatureExtractor ... save_pretrained)"
    )


# --- processed examples -----------------------------------------------------------------------------


@dataclass
class MediaFeatures:
    """Fixed-size processed inputs, one row per example; the `TokenizedText` interface the batching uses."""

    arrays: dict[str, np.ndarray]  # model input name -> (N, ...) uint8 or float16
    norm: dict[str, Any] | None = None  # uint8 pixel_values: rescale and normalise per batch (images.normalise)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    @property
    def lengths(self) -> np.ndarray:
        return np.ones(len(self), dtype=np.int64)  # every example has the same size: nothing to group

    def row(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self.arrays.items()}

    def subset(self, rows: np.ndarray) -> MediaFeatures:
        return MediaFeatures({k: v[rows] for k, v in self.arrays.items()}, self.norm)

    @staticmethod
    def concat(parts: list[MediaFeatures]) -> MediaFeatures:
        """The rows of `parts`, end to end (a mixture's sources): the same inputs, processed alike."""
        first = parts[0]
        for p in parts[1:]:
            if p.arrays.keys() != first.arrays.keys() or p.norm != first.norm or p.input_shapes != first.input_shapes:
                raise DataError("the sources of a mixture give inputs of different shapes; process them alike")
        return MediaFeatures({k: np.concatenate([p.arrays[k] for p in parts]) for k in first.arrays}, first.norm)

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: (1, *v.shape[1:]) for k, v in self.arrays.items()}

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.arrays.values())


class MediaCollator:
    """Stacks fixed-size examples; widens (and normalises) to float32; augments training batches if asked."""

    def __init__(self, task: str, norm: dict[str, Any] | None = None, augment: bool = False, seed: int = 0):
        self.task, self.norm, self.augment, self.seed = task, norm, augment, seed

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        import torch

        from leantrain.data.batching import slot_fields

        batch: dict[str, Any] = {}
        keys = [k for k in items[0] if k not in ("label", "slot")]
        index = [x["slot"].index for x in items]
        rng = np.random.default_rng([self.seed, *index]) if self.augment else None
        for k in keys:
            x = torch.from_numpy(np.stack([it[k] for it in items]))
            if k == "pixel_values":
                x = image_mod.normalise(x, self.norm)
                if rng is not None:
                    x = image_mod.shift_images(x, rng)
            else:
                x = x.float()
                if rng is not None:
                    x = audio_mod.shift_audio(x, rng, name=k)
            batch[k] = x
        batch["labels"] = torch.tensor([x["label"] for x in items], dtype=torch.long)
        batch.update(slot_fields(items))
        batch["num_tokens"] = batch["padded_tokens"] = torch.tensor(0)  # fixed-size inputs: no tokens, no padding
        return batch


# --- reading a source -------------------------------------------------------------------------------


@dataclass
class MediaListing:
    """What a source holds before decoding: one item (path, bytes or array) per example."""

    source: str
    items: list[Any]
    names: list[str]  # shown in messages and matched by --eval-pattern: the path inside the folder or table
    labels: list[str] | None
    label_from: str  # "folder", "pattern", "column 'x'", "idx"
    input_from: str
    report: ReadReport
    fingerprint: str = ""


def list_source(
    source: str,
    task: str,
    need_labels: bool = True,
    input_column: str | None = None,
    label_column: str | None = None,
    label_pattern: str | None = None,
    split: str = "train",
    options: ReadOptions | None = None,
) -> MediaListing:
    from leantrain.data.sources import _looks_like_hub_name, split_config

    path = Path(source)
    table = (source, task, need_labels, input_column, label_column, label_pattern, split, options)
    if not path.exists():
        _, config = split_config(source)
        if config is not None or _looks_like_hub_name(source):  # a hub data set (from the cache offline)
            return _list_table(*table)
        raise DataError(f"{source}: no such file or folder; check the path given to --data/--eval-data")
    if path.is_dir():
        if task == IMAGE and (pair := image_mod.find_idx_pair(path)) is not None:
            return _list_idx(path, *pair)
        saved = (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
        if saved or (options is not None and options.config is not None):  # a data set, not a class folder
            return _list_table(*table)
        return _list_folder(path, task, need_labels, label_pattern)
    if path.suffix.lower() in TABLE_SUFFIXES or (options is not None and options.format is not None):
        return _list_table(*table)
    suffixes = image_mod.IMAGE_SUFFIXES if task == IMAGE else audio_mod.AUDIO_SUFFIXES
    if path.suffix.lower() in suffixes and not need_labels:  # one file to predict
        st = path.stat()
        return MediaListing(
            source, [str(path)], [str(path)], None, "-", "file", ReadReport(source, rows_read=1), f"{st.st_size}"
        )
    raise DataError(
        f"{source}: give a folder of {kind(task)} files (one sub-folder per class, or --label-pattern) "
        f"or a table ({', '.join(sorted(TABLE_SUFFIXES))}) with an {kind(task)} column"
    )


def refuse_unread_columns(task: str, sources: Sequence[tuple[str | None, ReadOptions | None]], **given: Any) -> None:
    """A column flag (`given`: image_column, audio_column, label_column) where no source is a table: a folder of
    files or IDX files has no columns, so the flag would be ignored without a word."""
    named = [(key, value) for key, value in given.items() if value is not None]
    paths = [(source, options) for source, options in sources if source is not None]
    if not named or not paths or any(_is_table(source, task, options) for source, options in paths):
        return
    key, value = named[0]
    flag, source = "--" + key.replace("_", "-"), paths[0][0]
    idx = task == IMAGE and image_mod.find_idx_pair(Path(source)) is not None
    labels = "its idx1 file holds the labels" if idx else "labels come from class sub-folders or --label-pattern"
    raise DataError(
        f"{flag} {value}: {source} is a folder of {'IDX' if idx else kind(task)} files, not a table, so it has no "
        f"columns; leave {flag} out ({labels})"
    )


def _is_table(source: str, task: str, options: ReadOptions | None) -> bool:
    """Whether `list_source` reads `source` as a table (or refuses it in its own words): not a folder of files."""
    path = Path(source)
    if not path.is_dir():
        return True
    if task == IMAGE and image_mod.find_idx_pair(path) is not None:
        return False
    saved = (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
    return saved or (options is not None and options.config is not None)


def _label_from_pattern(pattern: str, name: str) -> str | None:
    m = re.search(pattern, name)
    if m is None:
        return None
    if "label" in m.re.groupindex:
        return m.group("label")
    return m.group(1) if m.re.groups else m.group(0)


def _list_folder(path: Path, task: str, need_labels: bool, label_pattern: str | None) -> MediaListing:
    suffixes = image_mod.IMAGE_SUFFIXES if task == IMAGE else audio_mod.AUDIO_SUFFIXES
    files, others = [], 0
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(path).parts):
            continue
        if p.suffix.lower() in suffixes:
            files.append(p)
            st = p.stat()
            h.update(f"{p.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            others += 1
    report = ReadReport(source=str(path))
    if not files:
        raise DataError(
            f"{path}: no {kind(task)} files ({', '.join(sorted(suffixes))}) in this folder or its sub-folders"
        )
    names = [p.relative_to(path).as_posix() for p in files]
    report.rows_read = len(files)
    if others:
        log.info("%s: %d files that are not %s files ignored", path, others, kind(task))
    labels: list[str] | None = None
    label_from = "-"
    if need_labels and label_pattern:
        found = [_label_from_pattern(label_pattern, n) for n in names]
        keep = [i for i, x in enumerate(found) if x]
        if not keep:
            raise DataError(
                f"{path}: no file name matches --label-pattern '{label_pattern}' (e.g. '{names[0]}'); "
                "its first group (or the group named 'label') must capture the label"
            )
        report.drop("whose path does not match --label-pattern", len(names) - len(keep))
        files, names, labels = [files[i] for i in keep], [names[i] for i in keep], [str(found[i]) for i in keep]
        label_from = f"pattern '{label_pattern}'"
    elif need_labels:
        classes = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not classes:
            raise DataError(
                f"{path}: cannot tell the labels: put each class's files in its own sub-folder, or give "
                "--label-pattern (a regular expression whose first group is the label, e.g. '^(\\d+)_')"
            )
        _refuse_split_folders(path, classes, names)
        counts = {c: 0 for c in classes}
        for n in names:
            if "/" in n:
                counts[n.split("/", 1)[0]] += 1
        empty = [c for c, n in counts.items() if n == 0]
        if empty:
            raise DataError(
                f"{path}: class folder '{empty[0]}' holds no {kind(task)} files"
                + (f" (nor do {len(empty) - 1} others)" if len(empty) > 1 else "")
                + "; add files or remove the folder"
            )
        keep = [i for i, n in enumerate(names) if "/" in n]
        report.drop("outside a class folder", len(names) - len(keep))
        files, names = [files[i] for i in keep], [names[i] for i in keep]
        labels = [n.split("/", 1)[0] for n in names]
        label_from = "class folders"
    return MediaListing(str(path), [str(f) for f in files], names, labels, label_from, "files", report, h.hexdigest())


#: sub-folder names that split a data set rather than name a class (train/cat/1.jpg)
SPLIT_FOLDERS = ("train", "training", "val", "valid", "validation", "dev", "eval", "test", "testing")


def _refuse_split_folders(path: Path, classes: list[str], names: list[str]) -> None:
    """A folder of splits, each with its class folders, would otherwise train a 'train' vs 'test' classifier."""
    if not all(c.lower() in SPLIT_FOLDERS for c in classes) or not any(n.count("/") >= 2 for n in names):
        return
    train = next((c for c in classes if c.lower().startswith("train")), classes[0])
    held = next((c for c in classes if c != train), None)
    fix = f"--data {path / train}" + (f" --eval-data {path / held}" if held else "")
    raise DataError(
        f"{path}: its sub-folders ({', '.join(classes)}) look like splits, each with its own class folders, not "
        f"classes; give each split's own folder (e.g. {fix})"
    )


def _list_idx(path: Path, images: Path, labels: Path) -> MediaListing:
    x, y = image_mod.read_idx(images), image_mod.read_idx(labels)
    if x.ndim not in (3, 4) or y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{path}: IDX images {x.shape} and labels {y.shape} do not match")
    if x.ndim == 4 and x.shape[-1] not in image_mod.IDX_CHANNELS:
        raise DataError(
            f"{images}: IDX images of shape {x.shape} have {x.shape[-1]} channels; write (N, H, W) grey images or "
            "(N, H, W, C) with C 1 (grey), 3 (RGB) or 4 (RGBA)"
        )
    x = image_mod.idx_pixels(x, images)
    fractional = ~np.isfinite(y) | (y != np.round(y)) if y.dtype.kind == "f" else np.zeros(len(y), bool)
    if fractional.any():  # int() would truncate 1.5 into class 1
        raise DataError(
            f"{labels}: IDX labels are class numbers, but label {int(fractional.argmax())} is "
            f"{y[fractional.argmax()]:g}; write whole numbers"
        )
    fp = source_fingerprint(str(images)) + source_fingerprint(str(labels))
    report = ReadReport(source=str(path), rows_read=len(x))
    return MediaListing(
        str(path), list(x), [f"{images.name}[{i}]" for i in range(len(x))], [str(int(v)) for v in y], "idx",
        "IDX", report, fp,
    )  # fmt: skip


def _list_table(
    source: str,
    task: str,
    need_labels: bool,
    input_column: str | None,
    label_column: str | None,
    label_pattern: str | None,
    split: str,
    options: ReadOptions | None = None,
) -> MediaListing:
    from leantrain.data.sources import read_table

    df, report = read_table(source, split=split, options=options, media=True)
    input_column = _input_column(df, source, task, input_column)
    items, names, fingerprint = _table_items(df[input_column].tolist(), source)
    labels: list[str] | None = None
    label_from = "-"
    if need_labels:
        import pandas as pd

        from leantrain.data.columns import missing_labels

        raw, label_from = _table_labels(df, source, names, label_column, label_pattern)
        missing, why = missing_labels(pd.Series(raw, dtype=object))
        keep = [i for i, gone in enumerate(missing) if not gone]
        report.drop(why, len(raw) - len(keep))
        items, names, labels = [items[i] for i in keep], [names[i] for i in keep], [raw[i] for i in keep]
    return MediaListing(source, items, names, labels, label_from, f"column '{input_column}'", report, fingerprint)


def _input_column(df, source: str, task: str, given: str | None) -> str:
    """The table's column of images or audio: `given`, else a known name, else its only column of dicts."""
    cols = [str(c) for c in df.columns]
    flag = "--image-column" if task == IMAGE else "--audio-column"
    if given is not None:
        if given not in cols:
            raise DataError(f"{source}: no column '{given}' (given by {flag}); columns are {cols}")
        return given
    lower = {c.lower(): c for c in cols}
    found = next((lower[n] for n in (IMAGE_COLUMNS if task == IMAGE else AUDIO_COLUMNS) if n in lower), None)
    if found is None:
        dicts = [c for c in cols if len(df) and isinstance(df[c].iloc[0], dict)]
        found = dicts[0] if len(dicts) == 1 else None
    if found is None:
        raise DataError(f"{source}: cannot tell which column holds the {kind(task)}s among {cols}; name it with {flag}")
    return found


def _table_items(values: list[Any], source: str) -> tuple[list[Any], list[str], str]:
    """(items, names, fingerprint) of a table's column: `datasets` Image/Audio dicts and bytes as they are, paths
    resolved against the table's folder (their sizes and times in the fingerprint)."""
    base = Path(source) if Path(source).is_dir() else Path(source).parent
    items: list[Any] = []
    names: list[str] = []
    h = hashlib.sha256(source_fingerprint(source).encode())
    for i, v in enumerate(values):
        if isinstance(v, dict):
            items.append(v)
            names.append(str(v.get("path") or f"row {i + 1}"))
        elif isinstance(v, bytes):
            items.append(v)
            names.append(f"row {i + 1}")
        else:
            p = Path(str(v)).expanduser()
            full = p if p.is_absolute() else base / p
            items.append(str(full))
            names.append(str(v))
            try:
                st = full.stat()
                h.update(f"{full}:{st.st_size}:{st.st_mtime_ns}".encode())
            except OSError:
                h.update(f"{full}:missing".encode())
    return items, names, h.hexdigest()


def _table_labels(df, source: str, names: list[str], label_column: str | None, label_pattern: str | None):
    """(each row's label as a string, where labels came from): --label-column, a known label column's name, or
    --label-pattern on the rows' names."""
    from leantrain.data.columns import LABEL_NAMES, normalise_labels

    cols = [str(c) for c in df.columns]
    if label_column is not None and label_column not in cols:
        raise DataError(f"{source}: no column '{label_column}' (given by --label-column); columns are {cols}")
    if label_column is None and not label_pattern:
        lower = {c.lower(): c for c in cols}
        label_column = next((lower[n] for n in LABEL_NAMES if n in lower), None)
        if label_column is None:
            raise DataError(
                f"{source}: cannot tell which column holds the label among {cols}; name it with --label-column "
                "or take it from the paths with --label-pattern"
            )
    if label_column is not None:
        return normalise_labels(df[label_column]).tolist(), f"column '{label_column}'"
    assert label_pattern is not None
    return [_label_from_pattern(label_pattern, n) or "" for n in names], f"pattern '{label_pattern}'"


# --- decoding and processing ------------------------------------------------------------------------


@dataclass
class MediaSource:
    """One source after processing (or loading from the cache)."""

    path: str
    features: MediaFeatures
    labels: list[str]  # empty when predicting
    names: list[str]
    label_from: str
    report: ReadReport
    cache_hit: bool
    skipped: list[str] = field(default_factory=list)  # the first unreadable files' names
    max_seconds: float | None = None

    def summary(self) -> str:
        """The rows read and dropped, the first unreadable files named."""
        text = self.report.summary()
        if self.skipped:
            text += (
                f" (unreadable, skipped: {', '.join(self.skipped)}{', ...' if self.report.rows_dropped > 5 else ''})"
            )
        return text

    def describe(self) -> str:
        text = self.summary()
        shapes = ", ".join(f"{k} {tuple(v.shape[1:])} {v.dtype}" for k, v in self.features.arrays.items())
        cached = "processed data loaded from cache" if self.cache_hit else "processed and cached"
        return f"{text}; labels from {self.label_from}; {shapes}, {self.features.nbytes / 2**20:.1f} MB; {cached}"


STRICT_HINT = "; --strict stops at the first unreadable file (without it such files are skipped)"


def _decode_all(listing: MediaListing, decode, strict: bool, what: str, failed: list[str]):
    """Decode every item; yield (position, value). Unreadable items are collected in `failed`, or stop under strict."""
    for i, item in enumerate(listing.items):
        try:
            value = decode(item)
        except DataError:
            raise
        except Exception as exc:
            if strict:
                raise DataError(
                    f"{listing.names[i]}: cannot read as {what} ({type(exc).__name__}: {str(exc)[:120]})"
                    + (STRICT_HINT if listing.source != "--file" else "")
                ) from None
            failed.append(listing.names[i])
            continue
        yield i, value


def process_source(listing: MediaListing, mp: MediaProcessor, strict: bool = False) -> MediaSource:
    """Decode and process every item of `listing` with `mp`, in chunks (memory stays at one chunk of decoded files)."""
    what = kind(mp.task)
    failed: list[str] = []
    processed = _Processed(mp, listing.source)
    kept: list[int] = []
    for chunk in _chunks(_decoded(listing, mp, strict, failed), CHUNK):
        processed.add([value for _, value in chunk], [listing.names[i] for i, _ in chunk])
        kept += [i for i, _ in chunk]
    listing.report.drop(f"unreadable {what} files", len(failed))
    if not kept:
        raise DataError(f"{listing.source}: none of the {len(listing.items):,} {what} files could be read")
    arrays = {k: np.concatenate(v) for k, v in processed.parts.items()}
    labels = [listing.labels[i] for i in kept] if listing.labels is not None else []
    return MediaSource(
        listing.source,
        MediaFeatures(arrays, processed.norm),
        labels,
        [listing.names[i] for i in kept],
        listing.label_from,
        listing.report,
        False,
        failed[:5],
        mp.max_seconds,
    )


def _decoded(listing: MediaListing, mp: MediaProcessor, strict: bool, failed: list[str]) -> Iterator[tuple[int, Any]]:
    """(position, decoded value) of every readable item. Audio without a set length: the longest clip decides
    (capped at MAX_AUTO_SECONDS), so the clips are decoded into a list first."""
    what = kind(mp.task)
    if mp.task != AUDIO:
        return _decode_all(listing, lambda it: image_mod.decode_image(it, mp.channels), strict, what, failed)
    target = mp.sampling_rate
    stream = _decode_all(listing, lambda it: _audio(it, target, listing), strict, what, failed)
    if mp.max_seconds is not None:
        return stream
    decoded = list(stream)
    longest = max((len(w) for _, w in decoded), default=0) / target
    mp.max_seconds = round(min(max(longest, 0.01), MAX_AUTO_SECONDS), 3)
    return iter(decoded)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Processed:
    """The processor's output for a source, a chunk of decoded items at a time."""

    def __init__(self, mp: MediaProcessor, source: str):
        self.mp, self.source = mp, source
        self.parts: dict[str, list[np.ndarray]] = {}
        self.norm: dict[str, Any] | None = None
        self.expected: Any = tuple(mp.image_size) if mp.image_size else None  # images the model does not resize

    def add(self, chunk: list[Any], names: list[str] | None = None) -> None:
        mp = self.mp
        if mp.task == AUDIO:
            assert mp.max_seconds is not None  # set by `_decoded`
            samples = round(mp.max_seconds * mp.sampling_rate)
            out = audio_mod.process_audio(mp.processor, [audio_mod.fit_length(w, samples) for w in chunk])
        else:
            if not mp.resizes:
                image_mod.check_sizes(chunk, self.expected, self.source, names or [])
                self.expected = chunk[0].shape[:2]
            pixels, self.norm = image_mod.process_images(mp.processor, chunk)
            out = {"pixel_values": pixels}
        for k, v in out.items():
            self.parts.setdefault(k, []).append(v)


def _audio(item: Any, target: int, listing: MediaListing) -> np.ndarray:
    wave, rate = audio_mod.decode_audio(item)
    name = item if isinstance(item, str) else listing.source
    return audio_mod.resample(wave, rate, target, name)


def load_media_source(
    source: str,
    mp: MediaProcessor,
    cache_dir: Path | None,
    split: str = "train",
    need_labels: bool = True,
    input_column: str | None = None,
    label_column: str | None = None,
    label_pattern: str | None = None,
    strict: bool = False,
    options: ReadOptions | None = None,
) -> MediaSource:
    """List, then load from the cache or decode and process (and cache) one source."""
    listing = list_source(source, mp.task, need_labels, input_column, label_column, label_pattern, split, options)
    key = cache_key(
        kind="media",
        read=(options or ReadOptions()).key(),
        source=listing.fingerprint,
        split=split,
        labels=need_labels,
        input=input_column,
        label=label_column,
        pattern=label_pattern,
        processor=mp.fingerprint(),
        strict=strict,
        version=MEDIA_CACHE_VERSION,
    )
    path = cache_dir / "processed" / f"{key}.npz" if cache_dir is not None else None
    cached = _load_cached(path) if path is not None else None
    if cached is not None:
        # entries are found by content: the same files under another path are named as given now
        cached.path = cached.report.source = listing.source
        if mp.max_seconds is None:
            mp.max_seconds = cached.max_seconds
        return cached
    result = process_source(listing, mp, strict)
    if path is not None:
        try:
            _save_cached(path, result)
        except OSError as exc:
            log.warning("could not write the processed-data cache at %s (%s)", path, exc)
    return result


def _save_cached(path: Path, src: MediaSource) -> None:
    from leantrain.paths import written_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "path": src.path,
        "label_from": src.label_from,
        "report": src.report.__dict__,
        "skipped": src.skipped,
        "max_seconds": src.max_seconds,
        "norm": src.features.norm,
    }
    arrays: dict[str, Any] = {f"x_{k}": v for k, v in src.features.arrays.items()}
    arrays["labels"] = np.asarray(src.labels, dtype=object).astype(str)
    arrays["names"] = np.asarray(src.names, dtype=object).astype(str)
    arrays["meta"] = np.asarray(json.dumps(meta))
    with written_atomically(path) as f:
        np.savez(f, **arrays)


def _load_cached(path: Path) -> MediaSource | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k[2:]: z[k] for k in z.files if k.startswith("x_")}
            return MediaSource(
                meta["path"],
                MediaFeatures(arrays, meta["norm"]),
                z["labels"].tolist(),
                z["names"].tolist(),
                meta["label_from"],
                ReadReport(**meta["report"]),
                True,
                meta["skipped"],
                meta["max_seconds"],
            )
    except Exception:  # a damaged cache entry is rebuilt, never trusted
        return None


# --- train and eval sets ----------------------------------------------------------------------------


def prepare_media_data(
    data: DataConfig, mp: MediaProcessor, cache_dir: Path, codec=None, *, seed: int, check_columns: bool = True
):
    """Load (or reuse) the processed training and evaluation sets that the data section describes (a PreparedData);
    `codec` turns labels into targets (`data.labels`; default: class ids, checked against the training labels);
    `seed` draws the held-out files and the --limit sample; `check_columns`: refuse a column flag that no source
    reads (a mixture's sources are checked together)."""
    from leantrain.data.columns import Columns
    from leantrain.data.prepare import PreparedData

    input_column = data.image_column if mp.task == IMAGE else data.audio_column
    common: dict[str, Any] = dict(
        mp=mp,
        cache_dir=cache_dir,
        input_column=input_column,
        label_column=data.label_column,
        label_pattern=data.label_pattern,
        strict=data.strict,
    )
    assert isinstance(data.data, str), "one source, resolved: data.combine reads a mixture's sources one at a time"
    sources = [(data.data, read_options(data, "train")), (data.eval_data, read_options(data, "eval"))]
    if check_columns:
        given = {column_key(mp.task): input_column, "label_column": data.label_column}
        refuse_unread_columns(mp.task, sources, **given)
    train_src = load_media_source(data.data, split="train", options=read_options(data, "train"), **common)
    notes = [train_src.describe()]
    eval_src = None
    if data.eval_data:
        eval_src = load_media_source(data.eval_data, split="eval", options=read_options(data, "eval"), **common)
        notes.append(eval_src.describe())
    pattern_rows = _pattern_rows(data, train_src) if data.eval_pattern and eval_src is None else None
    held = set(pattern_rows.tolist()) if pattern_rows is not None else set()
    labels = _MediaLabels.fit([x for i, x in enumerate(train_src.labels) if i not in held], train_src, codec)
    all_data, eval_set, train_rows = _held_out(data, train_src, eval_src, labels, pattern_rows, seed, notes)
    if len(train_rows) < 2:
        raise DataError(f"{train_src.path}: only {len(train_rows)} usable files; need at least two")
    if data.limit is not None and data.limit < len(train_rows):
        train_rows = _limited(all_data.labels, train_rows, data.limit, seed)
        notes.append(f"training on a stratified sample of {len(train_rows):,} files (--limit)")
    elif over := beyond_limit(data.limit, len(train_rows), "training files"):
        notes.append(over)
    if mp.task == AUDIO:
        notes.append(f"audio resampled to {mp.sampling_rate} Hz, padded or cut to {mp.max_seconds:g} s")
    columns = Columns(text=input_column or kind(mp.task), label=train_src.label_from)
    return PreparedData(all_data.subset(train_rows), eval_set, labels.names, columns, notes)


def column_key(task: str) -> str:
    """The config key that names the column of this task's inputs."""
    return "image_column" if task == IMAGE else "audio_column"


def _pattern_rows(data: DataConfig, train_src: MediaSource) -> np.ndarray:
    """The training files that --eval-pattern holds out; refused when it picks none or all of them."""
    assert data.eval_pattern is not None
    matches = np.array([re.search(data.eval_pattern, n) is not None for n in train_src.names])
    if not matches.any() or matches.all():
        raise ConfigError(
            f"--eval-pattern '{data.eval_pattern}' matches {'none' if not matches.any() else 'all'} of the "
            f"{len(matches):,} files of {data.data} (e.g. '{train_src.names[0]}'); it must pick the evaluation files"
        )
    return np.flatnonzero(matches)


@dataclass
class _MediaLabels:
    """The head's label names, fitted on the training files' labels, and how labels become targets."""

    names: list[str]
    codec: Any = None  # None: class ids, a label the training files lack refused

    @classmethod
    def fit(cls, labels: list[str], src: MediaSource, codec: Any) -> _MediaLabels:
        if codec is not None:
            return cls(codec.fit(labels, src.path, src.label_from), codec)
        import pandas as pd

        from leantrain.data.columns import build_label_map

        return cls(build_label_map(pd.Series(labels), src.path, src.label_from))

    def ids(self, labels: list[str], src: MediaSource, unseen_ok: bool = False) -> np.ndarray:
        """`labels` as targets; without a codec an unseen label is refused (or, `unseen_ok`, becomes -1)."""
        if self.codec is not None:
            return self.codec.encode(labels, src.path, src.label_from)
        label_id = {name: i for i, name in enumerate(self.names)}
        unseen = sorted(set(labels) - set(label_id))
        if unseen and not unseen_ok:
            raise DataError(
                f"{src.path}: labels {unseen[:5]} never occur in the training data (which has {self.names[:10]}); "
                "fix or drop those files"
            )
        return np.array([label_id.get(x, -1) for x in labels], dtype=np.int64)


def _held_out(data: DataConfig, train_src: MediaSource, eval_src: MediaSource | None, labels: _MediaLabels,
              pattern_rows: np.ndarray | None, seed: int, notes: list[str]):  # fmt: skip
    """(the training source's examples, the evaluation set, the training rows among those examples): the files
    --eval-pattern picks, --eval-data's, or a stratified --eval-fraction of the training files."""
    from leantrain.data.prepare import Examples
    from leantrain.data.split import stratified_split

    if pattern_rows is not None:  # held-out files may carry labels the training files lack: checked just below
        all_data = Examples(train_src.features, labels.ids(train_src.labels, train_src, unseen_ok=True))
        labels.ids([train_src.labels[i] for i in pattern_rows], train_src)
        notes.append(
            f"{len(pattern_rows):,} files matching --eval-pattern '{data.eval_pattern}' held out for evaluation"
        )
        return all_data, all_data.subset(pattern_rows), np.setdiff1d(np.arange(len(all_data)), pattern_rows)
    all_data = Examples(train_src.features, labels.ids(train_src.labels, train_src))
    if eval_src is not None:
        return all_data, Examples(eval_src.features, labels.ids(eval_src.labels, eval_src)), np.arange(len(all_data))
    train_rows, eval_rows = stratified_split(all_data.labels, data.eval_fraction, seed)
    notes.append(
        f"held out {counted(len(eval_rows), 'example')} ({data.eval_fraction:.0%}, stratified, seed {seed}) for "
        "evaluation"
    )
    return all_data, all_data.subset(eval_rows), train_rows


def _limited(labels: np.ndarray, train_rows: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """--limit: a stratified sample of `limit` of the training rows (seed + 1: apart from the held-out draw)."""
    from leantrain.data.split import stratified_split

    keep, _ = stratified_split(labels[train_rows], 1 - limit / len(train_rows), seed + 1, exact_first=limit)
    return np.sort(train_rows[keep])


def model_config(name: str, config, mp: MediaProcessor, trust_remote_code: bool = False):
    """The config to build the model from: a preset's sized to the processed inputs (audio length), else `name`'s."""
    from leantrain.model import loading, presets

    if presets.is_preset(name):
        return presets.preset_config(name, max_seconds=mp.max_seconds)
    return loading.load_config(name, trust_remote_code=trust_remote_code)
