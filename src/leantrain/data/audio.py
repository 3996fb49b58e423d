"""Audio: read WAV files (scipy; other formats through `soundfile` when installed), mix to mono, resample to
the feature extractor's rate (polyphase, scipy), pad or cut to a fixed length, extract features.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from leantrain.errors import DataError

AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".mp3", ".aiff", ".aif"})
MAX_RESAMPLE_FACTOR = 2000  # larger up/down factors mean a filter too long to be sensible (odd rates)
#: a float clip's largest sample magnitude that is still audio at full scale 1.0 (a master's overs stay within a
#: few dB; 30 dB over is a clip written from integer values without scaling)
MAX_FLOAT_PEAK = 32.0


def decode_audio(item: Any) -> tuple[np.ndarray, int]:
    """(mono float32 waveform in [-1, 1], sampling rate) from a path, bytes or a datasets dict."""
    if isinstance(item, dict):
        if item.get("array") is not None and item.get("sampling_rate"):
            return _mono(np.asarray(item["array"], dtype=np.float32)), int(item["sampling_rate"])
        item = item.get("bytes") or item.get("path")
    name = str(item) if not isinstance(item, bytes) else ""
    is_wav = (isinstance(item, bytes) and item[:4] == b"RIFF") or Path(name).suffix.lower() in (".wav", ".wave")
    if is_wav:
        import warnings

        from scipy.io import wavfile

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # "chunk not understood": metadata chunks, harmless
            rate, data = wavfile.read(io.BytesIO(item) if isinstance(item, bytes) else item)
        _refuse_truncated([str(w.message) for w in caught])
        return _mono(_to_float(data)), int(rate)
    try:
        import soundfile
    except ImportError:
        suffix = Path(name).suffix.lower()
        if name and suffix not in AUDIO_SUFFIXES:  # an image given to an audio model: soundfile would not help
            raise DataError(
                f"{name}: not an audio file ({suffix or 'no suffix'}); give WAV files (FLAC, OGG, MP3: with soundfile)"
            ) from None
        raise DataError(
            f"{name or 'audio bytes'}: not a WAV file; reading other formats needs soundfile "
            "(pip install soundfile), or convert the files to WAV"
        ) from None
    data, rate = soundfile.read(io.BytesIO(item) if isinstance(item, bytes) else item, dtype="float32")
    return _mono(data), int(rate)


#: a data size that a writer which streamed the file left as unknown (ffmpeg writes 0xFFFFFFFF): not a truncation
_UNKNOWN_SIZE = 0xFFFF0000


def _refuse_truncated(messages: list[str]) -> None:
    """scipy reads a WAV cut short (a partial download or copy) up to its end with only a warning: it would train
    as a shorter clip padded with silence. Such a file is unreadable, as a cut-short image is."""
    for message in messages:
        found = re.search(r"Reached EOF prematurely.*expected (\d+) bytes", message)
        if found and int(found.group(1)) < _UNKNOWN_SIZE:
            raise ValueError(f"truncated: {message}")


def _to_float(data: np.ndarray) -> np.ndarray:
    if data.dtype == np.uint8:
        return (data.astype(np.float32) - 128) / 128
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(np.iinfo(data.dtype).max + 1)
    return data.astype(np.float32)


def _mono(data: np.ndarray) -> np.ndarray:
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 2:
        # the channels are the shorter axis: (samples, channels) from WAV and soundfile, (channels, samples) in
        # datasets' and torchaudio's arrays
        data = data.mean(axis=int(data.shape[0] > data.shape[1]))
    if data.ndim != 1 or data.size == 0:
        raise ValueError("no audio samples")
    bad = int(data.size - np.isfinite(data).sum())
    if bad:  # a float WAV can hold them: NaN features, then a NaN loss blamed on the learning rate
        raise ValueError(f"{bad:,} of its {data.size:,} samples are not finite (NaN or infinity)")
    peak = float(np.abs(data).max())
    if peak > MAX_FLOAT_PEAK:  # extractors expect [-1, 1]: a log-mel's level, a fixed normalisation, would be off
        raise ValueError(
            f"its float samples reach {peak:,.0f}, far beyond full scale (1.0): written from integers without "
            "scaling? Divide 16-bit values by 32768 before writing float audio"
        )
    return data


def resample(wave: np.ndarray, rate: int, target: int, name: str) -> np.ndarray:
    """Polyphase resampling to `target` Hz; a rate with no small ratio to the target is refused."""
    if rate == target:
        return wave
    if rate <= 0:
        raise DataError(f"{name}: sample rate {rate} Hz cannot be resampled to {target} Hz")
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    if max(up, down) > MAX_RESAMPLE_FACTOR:
        raise DataError(
            f"{name}: sample rate {rate} Hz cannot be resampled to {target} Hz (no small ratio: {up}/{down}); "
            "convert the file to a standard rate such as 8000, 16000, 22050, 44100 or 48000 Hz"
        )
    from scipy.signal import resample_poly

    return resample_poly(wave, up, down).astype(np.float32)


def fit_length(wave: np.ndarray, samples: int) -> np.ndarray:
    """Cut to `samples`, or pad with silence at the end."""
    if len(wave) >= samples:
        return wave[:samples]
    return np.pad(wave, (0, samples - len(wave)))


def native_seconds(extractor) -> float | None:
    """The input length a feature extractor fixes itself (AST's frames, Whisper's 30 s), or None."""
    if type(extractor).__name__ == "ASTFeatureExtractor":
        return round((extractor.max_length - 1) * 0.010 + 0.025, 3)
    n = getattr(extractor, "n_samples", None)
    if n:
        return n / extractor.sampling_rate
    return None


def process_audio(extractor, waves: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Features of equal-length waveforms at the extractor's rate, as float16 arrays."""
    out = extractor(waves, sampling_rate=extractor.sampling_rate, return_tensors="np")
    key = extractor.model_input_names[0]
    return {key: np.asarray(out[key], dtype=np.float16)}


def shift_audio(x, rng: np.random.Generator, fraction: float = 0.1, name: str = "input_values"):
    """Augmentation: roll each example along its time axis by up to `fraction` of its length.

    `name` is the model input: time is the first axis after the batch for waveforms (B, T) and AST's
    `input_values` (B, frames, mels); Whisper's `input_features` are (B, mels, frames), time last. The
    layout cannot be told from the shape: a clip under about 0.65 s has fewer AST frames than mel bins.
    """
    import torch

    axis = 2 if x.dim() == 3 and name == "input_features" else 1
    n = x.shape[axis]
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        k = int(rng.integers(-round(n * fraction), round(n * fraction) + 1))
        out[i] = torch.roll(x[i], k, dims=axis - 1)
    return out
