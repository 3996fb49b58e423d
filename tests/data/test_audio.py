"""Audio classification: WAV folders labelled by sub-folder or file-name pattern, tables, resampling, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.errors import DataError

TONES = {"0": 300.0, "1": 1200.0, "2": 2600.0}


def write_wav(path: Path, freq: float, seconds: float, rate: int, rng: np.random.Generator, stereo=False) -> None:
    from scipy.io import wavfile

    t = np.arange(int(rate * seconds)) / rate
    wave = 0.5 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(len(t))
    data = (wave * 20000).astype(np.int16)
    if stereo:
        data = np.stack([data, data], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    wavfile.write(path, rate, data)


@pytest.fixture(scope="module")
def fsdd_like(tmp_path_factory) -> Path:
    """`{digit}_{speaker}_{index}.wav` at 8 kHz, like FSDD: a tone per class, of varying length."""
    root = tmp_path_factory.mktemp("wavs")
    rng = np.random.default_rng(0)
    for label, freq in TONES.items():
        for i in range(12):
            write_wav(root / f"{label}_spk_{i}.wav", freq, rng.uniform(0.2, 0.8), 8000, rng)
    return root


@pytest.fixture()
def job(tmp_path):
    def make(**changes):
        base = dict(
            model="preset:tiny-audio",
            output_dir=str(tmp_path / "run"),
            cache_dir=str(tmp_path / "cache"),
            batch_size=8,
            epochs=2,
            lr=2e-3,
            progress=False,
            report=False,
            precision="fp32",
            max_seconds=0.5,
        )
        return TrainConfig(**{**base, **changes})

    return make


@pytest.mark.slow  # trains to learning: 201 s in the fast-tier run of 2026-11-30 (load 6-9, 2 cores)
def test_wav_folder_with_label_and_eval_patterns_trains_and_predicts(job, fsdd_like, tmp_path, capsys):
    from leantrain import evaluate, predict

    result = train(
        job(
            data=str(fsdd_like),
            label_pattern=r"^(\d+)_",
            eval_pattern=r"_[0-2]\.wav$",
            augment=True,
            epochs=8,
            batch_size=4,
            lr=1e-3,
        )
    )
    err = capsys.readouterr().err
    assert "labels from pattern" in err and "9 files matching --eval-pattern" in err
    assert "audio resampled to 16000 Hz, padded or cut to 0.5 s" in err
    m = result.metrics
    # it learns: 9 held-out clips, 3 per class (chance and the majority class: 3 of 9); measured 9 of 9 (and 8
    # of 9 at 12 epochs). With augmentation rolling the mel bins instead of the frames it stayed near 4 of 9.
    assert m["eval_accuracy"] >= 7 / 9 and m["num_labels"] == 3
    assert m["train_examples"] == 27 * 8  # examples seen: 27 training clips, 8 epochs
    model_dir = result.model_dir
    assert json.loads((model_dir / "leantrain_inputs.json").read_text())["max_seconds"] == 0.5
    assert json.loads((model_dir / "preprocessor_config.json").read_text())["feature_extractor_type"] == (
        "ASTFeatureExtractor"
    )
    rows = predict(str(result.output_dir), files=[str(fsdd_like / "2_spk_5.wav")])
    assert rows[0]["file"].endswith("2_spk_5.wav") and set(rows[0]["probabilities"]) == set(TONES)
    metrics = evaluate(str(result.output_dir), str(fsdd_like), label_pattern=r"^(\d+)_", cache_dir=str(tmp_path / "c"))
    assert metrics["examples"] == 36


@pytest.mark.slow  # trains to learning: 108 s in the fast-tier run of 2026-11-30 (load 6-9, 2 cores)
def test_class_subfolders_and_a_csv_of_paths(job, tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "d"
    rows = []
    for label, freq in TONES.items():
        for i in range(4):
            # 22.05 kHz stereo: mixed to mono and resampled
            write_wav(data / f"class{label}" / f"{i}.wav", freq, 0.3, 22050, rng, stereo=True)
            rows.append(f"class{label}/{i}.wav,class{label}")
    result = train(job(data=str(data), epochs=12, batch_size=3, lr=1e-3, eval_fraction=0.25))
    assert result.metrics["num_labels"] == 3
    table = data / "files.csv"
    table.write_text("file,label\n" + "\n".join(rows) + "\n")
    # the clips the table names, read through its `file` column, are the clips the model learned: a reader that
    # took the wrong column or the wrong files would score near chance (4 of 12)
    from leantrain import evaluate

    scored = evaluate(str(result.output_dir), str(table), cache_dir=str(tmp_path / "c"))
    assert scored["examples"] == 12 and scored["accuracy"] >= 10 / 12
    result = train(job(data=str(table), max_steps=2, eval_fraction=0.25, output_dir=str(tmp_path / "r2")))
    assert result.metrics["num_labels"] == 3


def test_stereo_is_mixed_to_mono_sample_by_sample(tmp_path):
    """Both channels count: the mono wave is their mean (a reader that kept one channel, or flattened the
    interleaved samples into a wave twice as long, fails here)."""
    from scipy.io import wavfile

    from leantrain.data.audio import decode_audio

    rng = np.random.default_rng(5)
    left = rng.integers(-20000, 20000, 400).astype(np.int16)
    right = rng.integers(-20000, 20000, 400).astype(np.int16)
    wavfile.write(tmp_path / "stereo.wav", 22050, np.stack([left, right], axis=1))
    wave, rate = decode_audio(str(tmp_path / "stereo.wav"))
    assert rate == 22050 and wave.shape == (400,)
    expected = (left.astype(np.float64) + right.astype(np.float64)) / 2 / 32768
    np.testing.assert_allclose(wave, expected, atol=1e-6)
    # a datasets (or torchaudio) array is channels first: its mean over the channels, not over time (2 samples)
    channels_first = np.stack([left, right]).astype(np.float32) / 32768
    wave, rate = decode_audio({"array": channels_first, "sampling_rate": 22050})
    assert rate == 22050 and wave.shape == (400,)
    np.testing.assert_allclose(wave, expected, atol=1e-6)
    np.testing.assert_allclose(
        decode_audio({"array": channels_first.T, "sampling_rate": 22050})[0], expected, atol=1e-6
    )


@pytest.mark.parametrize(
    "name,shape,time_axis",
    [
        ("input_values", (3, 48, 64), 1),  # AST features of a 0.5 s clip: fewer frames (48) than mel bins (64)
        ("input_values", (3, 98, 64), 1),  # AST, 1 s
        ("input_features", (3, 80, 300), 2),  # Whisper: mel bins first, frames last
        ("input_values", (3, 8000), 1),  # a raw waveform (wav2vec2)
    ],
)
def test_audio_augmentation_shifts_along_time_only(name, shape, time_axis):
    """A time shift keeps every frame's spectrum whole; shifting mel bins instead would move a tone to
    another pitch (another class, for the tones above)."""
    import torch

    from leantrain.data.audio import shift_audio

    x = torch.randn(shape)
    out = shift_audio(x, np.random.default_rng(0), fraction=0.2, name=name)
    moved = 0
    for i in range(shape[0]):
        shifts = [k for k in range(shape[time_axis]) if torch.equal(out[i], torch.roll(x[i], k, dims=time_axis - 1))]
        assert len(shifts) == 1, (i, "not a roll along time")
        moved += shifts[0] != 0
    assert moved > 0


def test_resampling_and_fixed_length():
    from leantrain.data.audio import fit_length, resample

    wave = np.sin(np.arange(8000) / 10).astype(np.float32)
    assert len(resample(wave, 8000, 16000, "x")) == 16000
    assert len(resample(wave, 44100, 16000, "x")) == -(-8000 * 16000 // 44100)
    with pytest.raises(DataError, match="cannot be resampled"):
        resample(wave, 7919, 16000, "odd.wav")
    assert len(fit_length(wave, 100)) == 100 and len(fit_length(wave, 9000)) == 9000
    assert fit_length(wave, 9000)[-1] == 0


def test_bad_audio_skipped_or_strict_and_odd_rates_exit_2(fsdd_like, tmp_path, capsys):
    import shutil

    data = tmp_path / "w"
    shutil.copytree(fsdd_like, data)
    (data / "1_spk_99.wav").write_bytes(b"RIFF....WAVEjunk")
    base = ["train", "--model", "preset:tiny-audio", "--data", str(data), "--label-pattern", r"^(\d+)_",
            "--max-steps", "1", "--no-progress", "--no-report", "--max-seconds", "0.3"]  # fmt: skip
    assert main([*base, "--cache-dir", str(tmp_path / "c1"), "--output-dir", str(tmp_path / "r1")]) == 0
    err = capsys.readouterr().err
    assert "1 dropped (1 unreadable audio files)" in err and "1_spk_99.wav" in err

    assert main([*base, "--strict", "--cache-dir", str(tmp_path / "c2"), "--output-dir", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "1_spk_99.wav: cannot read as audio" in err and "Traceback" not in err

    (data / "1_spk_99.wav").unlink()
    write_wav(data / "2_spk_77.wav", 500, 0.3, 7919, np.random.default_rng(2))
    assert main([*base, "--cache-dir", str(tmp_path / "c3"), "--output-dir", str(tmp_path / "r3")]) == 2
    err = capsys.readouterr().err
    assert "sample rate 7919 Hz cannot be resampled to 16000 Hz" in err and "Traceback" not in err


def test_patterns_that_pick_nothing_exit_2(fsdd_like, tmp_path, capsys):
    base = ["train", "--model", "preset:tiny-audio", "--data", str(fsdd_like), "--cache-dir", str(tmp_path / "c"),
            "--output-dir", str(tmp_path / "r"), "--no-progress"]  # fmt: skip
    assert main([*base, "--label-pattern", r"^speaker(\d)"]) == 2
    assert "no file name matches --label-pattern" in capsys.readouterr().err
    assert main([*base, "--label-pattern", r"^(\d)_", "--eval-pattern", r"_99\.wav$"]) == 2
    assert "--eval-pattern '_99\\.wav$' matches none" in capsys.readouterr().err
    assert main([*base, "--label-pattern", "(unclosed"]) == 2
    assert "is not a regular expression" in capsys.readouterr().err


def test_an_extractor_without_a_length_pads_to_the_longest_clip(fsdd_like):
    from transformers import Wav2Vec2FeatureExtractor

    from leantrain.data.media import AUDIO, MediaProcessor, list_source, process_source

    mp = MediaProcessor(AUDIO, Wav2Vec2FeatureExtractor(sampling_rate=16000))
    listing = list_source(str(fsdd_like), AUDIO, label_pattern=r"^(\d)_")
    src = process_source(listing, mp)
    assert mp.max_seconds is not None and 0.2 < mp.max_seconds <= 0.8
    values = src.features.arrays["input_values"]
    assert values.dtype == np.float16 and values.shape == (36, round(mp.max_seconds * 16000))


def test_the_model_cards_pipeline_snippet_scores_a_short_clip_as_predict_does(job, fsdd_like, tmp_path):
    """The AST extractor pads a short clip's frames with zeros, while training padded the samples with silence:
    `pipeline` on a bare short clip disagreed with `leantrain predict` on most FSDD clips. The card's snippet pads
    as training did; it runs here as written, on a clip half as long as --max-seconds."""
    from leantrain import predict
    from leantrain.data.audio import decode_audio, resample

    result = train(job(data=str(fsdd_like), label_pattern=r"^(\d+)_", max_steps=2, eval_fraction=0.25, seed=1))
    clip = tmp_path / "short.wav"
    write_wav(clip, TONES["1"], 0.25, 8000, np.random.default_rng(3))
    ours = predict(str(result.output_dir), files=[str(clip)])[0]["probabilities"]
    card = (result.model_dir / "README.md").read_text()
    snippet = card.split("## Use")[1].split("```python\n")[1].split("```")[0]
    assert "np.pad(samples" in snippet
    wave, rate = decode_audio(str(clip))
    printed: list = []
    scope = {"samples": resample(wave, rate, 16000, "x"), "print": printed.append}
    exec(snippet.replace("path/to/this/folder", str(result.model_dir)), scope)
    theirs = {r["label"]: r["score"] for r in printed[0]}
    assert max(abs(ours[k] - theirs[k]) for k in TONES) < 1e-4, (ours, theirs)


def test_a_hub_ast_extractor_pads_frames_alike_in_training_predict_and_the_cards_pipeline(job, fsdd_like, tmp_path):
    """A hub AST's extractor pads its filter-bank frames to its own max_length (1024, about 10 s; 128 here), which
    the model's position embeddings fix, whatever --max-seconds is. Training, predict and the card's pipeline
    snippet all pad the samples with silence to --max-seconds, then let the extractor pad the frames: the same
    frames (48 of 0.5 s, then 80 padded) and the same scores."""
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification, AutoFeatureExtractor, pipeline

    from leantrain import predict
    from leantrain.data.audio import decode_audio, resample
    from leantrain.data.media import AUDIO, _Processed, load_processor

    hub = tmp_path / "hub-ast"
    config = ASTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_mel_bins=16,
        max_length=128, patch_size=16, frequency_stride=16, time_stride=16,
    )  # fmt: skip
    torch.manual_seed(0)
    ASTForAudioClassification(config).save_pretrained(hub)
    ASTFeatureExtractor(num_mel_bins=16, max_length=128).save_pretrained(hub)
    result = train(job(model=str(hub), data=str(fsdd_like), label_pattern=r"^(\d+)_", max_steps=1, eval_fraction=0.25))
    clip = tmp_path / "short.wav"
    write_wav(clip, TONES["1"], 0.25, 8000, np.random.default_rng(3))
    wave, rate = decode_audio(str(clip))
    samples = resample(wave, rate, 16000, "x")

    def frames(mp):
        processed = _Processed(mp, "x")
        processed.add([samples])
        return processed.parts["input_values"][0][0]

    trained, predicted = (
        frames(load_processor(str(hub), config, AUDIO, 0.5)),
        frames(load_processor(str(result.model_dir), config, AUDIO)),
    )
    padded = np.pad(samples, (0, 8000 - len(samples)))  # the card's snippet
    extractor = AutoFeatureExtractor.from_pretrained(result.model_dir)
    piped = extractor(padded, sampling_rate=16000, return_tensors="np")["input_values"][0].astype(np.float16)
    assert trained.shape == (128, 16) and np.array_equal(trained, predicted) and np.array_equal(trained, piped)
    # 48 frames of 0.5 s (the tone, then silence), then the extractor's padding, which is not silence's
    assert len(np.unique(trained[48:])) == 1 and trained[48, 0] != trained[47, 0] and len(np.unique(trained[0])) > 1
    ours = predict(str(result.output_dir), files=[str(clip)])[0]["probabilities"]
    theirs = pipeline("audio-classification", model=str(result.model_dir))({"raw": padded, "sampling_rate": 16000})
    assert max(abs(ours[r["label"]] - r["score"]) for r in theirs) < 1e-4, (ours, theirs)


def test_a_wav_cut_short_is_unreadable_but_one_streamed_with_an_unknown_size_is_read(fsdd_like, tmp_path, capsys):
    """scipy reads a truncated WAV up to its end with a warning only: it trained as a shorter clip, silently."""
    from leantrain.data.audio import decode_audio

    whole = (fsdd_like / "0_spk_0.wav").read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="truncated"):
        decode_audio(str(cut))
    streamed = tmp_path / "streamed.wav"  # a writer that streamed it leaves the data size unknown: 0xFFFFFFFF
    at = whole.index(b"data") + 4
    streamed.write_bytes(whole[:at] + (0xFFFFFFFF).to_bytes(4, "little") + whole[at + 4 :])
    wave, rate = decode_audio(str(streamed))
    assert rate == 8000 and np.array_equal(wave, decode_audio(str(fsdd_like / "0_spk_0.wav"))[0])

    import shutil

    data = tmp_path / "w"
    shutil.copytree(fsdd_like, data)
    shutil.copy(cut, data / "1_spk_99.wav")
    base = ["train", "--model", "preset:tiny-audio", "--data", str(data), "--label-pattern", r"^(\d+)_",
            "--max-steps", "1", "--no-progress", "--no-report", "--max-seconds", "0.3"]  # fmt: skip
    assert main([*base, "--cache-dir", str(tmp_path / "c"), "--output-dir", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "1 dropped (1 unreadable audio files)" in err and "1_spk_99.wav" in err


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_clip_with_nan_or_infinite_samples_is_unreadable_not_a_nan_loss(fsdd_like, tmp_path, value):
    """A float WAV can hold NaN: its features were NaN, training stopped blaming the learning rate and predict gave
    NaN scores with exit 0."""
    import shutil

    from scipy.io import wavfile

    from leantrain.data.audio import decode_audio
    from leantrain.data.media import AUDIO, MediaProcessor, list_source, process_source
    from leantrain.model.presets import preset_processor

    data = tmp_path / "w"
    shutil.copytree(fsdd_like, data)
    wave = decode_audio(str(data / "1_spk_0.wav"))[0]
    wave[10:20] = value
    wavfile.write(data / "1_spk_99.wav", 8000, wave)
    with pytest.raises(ValueError, match=r"10 of its .* samples are not finite"):
        decode_audio(str(data / "1_spk_99.wav"))
    mp = MediaProcessor(AUDIO, preset_processor("preset:tiny-audio"), max_seconds=0.3)
    src = process_source(list_source(str(data), AUDIO, label_pattern=r"^(\d)_"), mp)
    assert src.skipped == ["1_spk_99.wav"] and len(src.names) == 36
    assert np.isfinite(src.features.arrays["input_values"].astype(np.float32)).all()
    with pytest.raises(DataError, match=r"1_spk_99.wav: cannot read as audio \(ValueError: 10 of its"):
        process_source(list_source(str(data / "1_spk_99.wav"), AUDIO, need_labels=False), mp, strict=True)


def test_a_float_clip_written_at_integer_scale_is_unreadable_not_silently_loud(fsdd_like, tmp_path):
    """A float WAV written from 16-bit values without scaling (samples up to thousands) gave features far off what
    the extractor was made for, without a word; a float clip whose overs stay near full scale is read as it is."""
    import shutil

    from scipy.io import wavfile

    from leantrain.data.audio import decode_audio
    from leantrain.data.media import AUDIO, MediaProcessor, list_source, process_source
    from leantrain.model.presets import preset_processor

    data = tmp_path / "w"
    shutil.copytree(fsdd_like, data)
    wave = decode_audio(str(data / "1_spk_0.wav"))[0]
    wavfile.write(data / "1_spk_99.wav", 8000, (wave / np.abs(wave).max() * 20000).astype(np.float32))
    wavfile.write(data / "1_spk_98.wav", 8000, (wave / np.abs(wave).max() * 1.5).astype(np.float32))  # overs
    with pytest.raises(ValueError, match=r"float samples reach 20,000, far beyond full scale \(1.0\)"):
        decode_audio(str(data / "1_spk_99.wav"))
    assert float(np.abs(decode_audio(str(data / "1_spk_98.wav"))[0]).max()) == pytest.approx(1.5)
    mp = MediaProcessor(AUDIO, preset_processor("preset:tiny-audio"), max_seconds=0.3)
    src = process_source(list_source(str(data), AUDIO, label_pattern=r"^(\d)_"), mp)
    assert src.skipped == ["1_spk_99.wav"] and len(src.names) == 37


def test_an_image_given_to_an_audio_model_is_not_sent_to_soundfile(tmp_path, monkeypatch):
    import sys

    from leantrain.data.audio import decode_audio

    monkeypatch.setitem(sys.modules, "soundfile", None)  # not installed
    with pytest.raises(DataError, match=r"cat.png: not an audio file \(.png\); give WAV files"):
        decode_audio(str(tmp_path / "cat.png"))


def test_a_wav2vec2_config_trains_from_scratch(job, fsdd_like, tmp_path):
    """A model without an input embedding table: the attention-mask probe asked for one and the run stopped on
    transformers' NotImplementedError (get_input_embeddings) before its first step, with or without --lora."""
    from transformers import Wav2Vec2Config

    from leantrain import predict

    folder = tmp_path / "w2v"
    Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        classifier_proj_size=16,
    ).save_pretrained(folder)  # fmt: skip
    for lora in (False, True):
        out = tmp_path / f"run-{lora}"
        result = train(job(model=str(folder / "config.json"), data=str(fsdd_like), label_pattern=r"^(\d+)_",
                           max_steps=1, eval_fraction=0.25, lora=lora, output_dir=str(out)))  # fmt: skip
        assert result.metrics["optimizer_steps"] == 1
        assert result.metrics["model_tflops"] > 0, result.metrics["flop_model"]  # SpecAugment once made it 0
    rows = predict(str(out), files=[str(fsdd_like / "2_spk_5.wav")])
    assert set(rows[0]["probabilities"]) == set(TONES)
