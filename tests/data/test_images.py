"""Image classification: folders, tables and IDX files; tiny ViTs from presets and configs; bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.errors import DataError

COLOURS = {"red": 0, "blue": 2}


def make_image(path: Path, colour: str, rng: np.random.Generator, size=(20, 24)) -> None:
    from PIL import Image

    a = rng.integers(0, 60, (*size, 3), dtype=np.uint8)
    a[..., COLOURS[colour]] += 180
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """Two classes of small PNGs told apart by colour: learnable in a few steps."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for colour in COLOURS:
        for i in range(24):
            make_image(root / colour / f"{i}.png", colour, rng)
    (root / "notes.txt").write_text("not an image, ignored")
    return root


@pytest.fixture()
def job(tmp_path):
    def make(**changes):
        base = dict(
            model="preset:tiny-vit",
            output_dir=str(tmp_path / "run"),
            cache_dir=str(tmp_path / "cache"),
            batch_size=16,
            epochs=3,
            lr=2e-3,
            progress=False,
            report=False,
            precision="fp32",
            eval_fraction=0.25,
        )
        return TrainConfig(**{**base, **changes})

    return make


def test_image_folder_trains_saves_processor_and_predicts(job, image_folder, tmp_path, capsys):
    from leantrain import evaluate, predict

    result = train(job(data=str(image_folder)))
    assert result.metrics["eval_accuracy"] == 1.0  # colour is all it takes
    assert result.metrics["train_samples_per_second"] > 0 and result.metrics["padding_fraction"] is None  # no tokens
    assert "FlopCounterMode" in result.metrics["flop_model"] and result.metrics["model_tflops"] > 0
    model_dir = result.model_dir
    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "leantrain_inputs.json"):
        assert (model_dir / name).is_file(), name
    assert json.loads((model_dir / "config.json").read_text())["id2label"] == {"0": "blue", "1": "red"}
    err = capsys.readouterr().err
    assert "labels from class folders" in err and "pixel_values (3, 32, 32) uint8" in err

    rows = predict(str(result.output_dir), files=[str(image_folder / "red" / "0.png")])
    assert rows[0]["label"] == "red" and set(rows[0]["probabilities"]) == {"red", "blue"}
    metrics = evaluate(str(result.output_dir), str(image_folder), cache_dir=str(tmp_path / "cache"))
    assert metrics["examples"] == 48 and metrics["accuracy"] == 1.0

    # a second run reuses the processed images
    train(job(data=str(image_folder), output_dir=str(tmp_path / "again"), max_steps=1))
    assert "processed data loaded from cache" in capsys.readouterr().err

    # the saved model also loads in a transformers pipeline, processor included
    from transformers import pipeline

    clf = pipeline("image-classification", model=str(model_dir))
    assert clf(str(image_folder / "blue" / "3.png"))[0]["label"] == "blue"
    assert clf(str(image_folder / "red" / "3.png"))[0]["label"] == "red"


def test_cli_predict_and_evaluate_on_image_files(job, image_folder, tmp_path, capsys):
    result = train(job(data=str(image_folder), max_steps=2))
    out = tmp_path / "pred.csv"
    assert main(["predict", str(result.output_dir), "--data", str(image_folder), "--output", str(out)]) == 0
    import pandas as pd

    pred = pd.read_csv(out)
    assert len(pred) == 48 and {"file", "label", "score", "p_red", "p_blue"} <= set(pred.columns)
    assert main(["predict", str(result.output_dir), "--text", "hello"]) == 2
    assert "an image classifier" in capsys.readouterr().err
    # a folder given to --file exists: not "no such file", but where its files go
    assert main(["predict", str(result.output_dir), "--file", str(image_folder / "red")]) == 2
    err = capsys.readouterr().err
    assert f"red: a folder; give its files with --data {image_folder / 'red'}" in err and len(err.splitlines()) == 1
    # a folder has no columns: a column flag given to evaluate or predict would be ignored
    for call in (["evaluate", "--label-column", "kind"], ["predict", "--image-column", "img"]):
        assert main([call[0], str(result.output_dir), "--data", str(image_folder), *call[1:]]) == 2
        err = capsys.readouterr().err
        assert f"{call[1]} {call[2]}: {image_folder} is a folder of image files, not a table" in err
        assert len(err.splitlines()) == 1


@pytest.mark.parametrize("flag", ["--image-column", "--label-column"])
def test_a_column_flag_on_a_folder_exits_2_unless_a_table_reads_it(image_folder, tmp_path, capsys, flag):
    args = ["train", "--model", "preset:tiny-vit", "--data", str(image_folder), flag, "x",
            "--cache-dir", str(tmp_path / "c"), "--output-dir", str(tmp_path / "r"), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{flag} x: {image_folder} is a folder of image files, not a table, so it has no columns" in err
    assert f"leave {flag} out" in err and len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
    # an evaluation table reads it: no refusal
    from leantrain.data.media import IMAGE, refuse_unread_columns
    from leantrain.data.sources import ReadOptions

    (table := tmp_path / "eval.csv").write_text("x,label\n")
    refuse_unread_columns(IMAGE, [(str(image_folder), None), (str(table), ReadOptions())], image_column="x")


def test_a_mixtures_column_flag_is_refused_only_where_no_source_is_a_table(job, image_folder, tmp_path):
    rows = [{"img": str(p), "category": p.parent.name} for p in sorted(image_folder.rglob("*.png"))]
    (table := tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the folder's labels are its class folders, the table's its 'category' column
    result = train(job(data=[str(image_folder), str(table)], label_column="category", max_steps=1))
    assert result.metrics["num_labels"] == 2
    with pytest.raises(DataError, match=f"--label-column category: {image_folder} is a folder of image files"):
        twice = [str(image_folder), {"path": str(image_folder), "name": "again"}]
        train(job(data=twice, label_column="category", output_dir=str(tmp_path / "b")))
    # a source's own column flag is read by its own files: on a folder beside a table, refused, naming the source
    own = [{"path": str(image_folder), "name": "shapes", "label_column": "category"}, str(table)]
    with pytest.raises(DataError, match=f"--data source shapes: --label-column category: {image_folder} is a folder"):
        train(job(data=own, label_column="category", output_dir=str(tmp_path / "c")))


def test_a_runs_recorded_column_flag_is_not_refused_where_evaluate_reads_its_folder_back(job, image_folder, tmp_path):
    """Runs trained before a column flag on a folder was refused recorded it (ignored) in config.yaml; evaluate
    reads the run's own held-out files back as the run read them, and refuses only a column flag given to it."""
    import yaml

    from leantrain import evaluate

    run = train(job(data=str(image_folder), max_steps=1)).output_dir
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "image_column": "x", "label_column": "y"}))
    assert "accuracy" in evaluate(str(run))
    assert "accuracy" in evaluate(str(run), str(image_folder))
    with pytest.raises(DataError, match=f"--image-column img: {image_folder} is a folder of image files"):
        evaluate(str(run), str(image_folder), image_column="img")


def test_unreadable_images_are_skipped_and_named_or_stop_the_run_with_strict(
    job, image_folder, tmp_path, capsys, caplog
):
    import shutil

    data = tmp_path / "imgs"
    shutil.copytree(image_folder, data)
    (data / "red" / "broken.png").write_bytes(b"\x89PNG not really")
    (data / "blue" / "empty.jpg").write_bytes(b"")
    result = train(job(data=str(data), max_steps=1))
    err = capsys.readouterr().err
    assert "2 dropped (2 unreadable image files)" in err
    assert "blue/empty.jpg" in err and "red/broken.png" in err
    assert result.metrics["train_examples"] > 0
    # evaluate scores the readable files and says which it left out: its score counts fewer files than given
    assert main(["evaluate", str(result.output_dir), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{") :])["skipped"] == 2
    said = "2 dropped (2 unreadable image files) (unreadable, skipped: blue/empty.jpg, red/broken.png)"
    assert said in caplog.text, caplog.text

    code = main(["train", "--model", "preset:tiny-vit", "--data", str(data), "--strict", "--cache-dir",
                 str(tmp_path / "c2"), "--output-dir", str(tmp_path / "r2"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "cannot read as image" in err and "--strict" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "layout, needle",
    [
        ("empty_class", "class folder 'green' holds no image files"),
        ("no_classes", "cannot tell the labels"),
        ("one_class", "a classifier needs at least two"),
        # not a 'train' vs 'test' classifier
        ("splits", "sub-folders (test, train) look like splits"),
        ("one_file", ".tsv) with an image column"),  # training on one image file
    ],
)
def test_bad_folders_exit_2_with_one_line(tmp_path, capsys, layout, needle):
    rng = np.random.default_rng(1)
    root = tmp_path / "d"
    if layout == "no_classes":
        for i in range(4):
            make_image(root / f"{i}.png", "red", rng)
    elif layout == "one_file":
        make_image(root / "red" / "0.png", "red", rng)
        root = root / "red" / "0.png"
    elif layout == "splits":
        for split in ("train", "test"):
            for colour in COLOURS:
                for i in range(3):
                    make_image(root / split / colour / f"{i}.png", colour, rng)
    else:
        for i in range(4):
            make_image(root / "red" / f"{i}.png", "red", rng)
        if layout == "empty_class":
            (root / "green").mkdir()
            (root / "green" / "readme.txt").write_text("x")
    code = main(["train", "--model", "preset:tiny-vit", "--data", str(root), "--cache-dir", str(tmp_path / "c"),
                 "--output-dir", str(tmp_path / "r"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _vit_config_folder(path: Path, image_size: int = 16, channels: int = 3) -> Path:
    from transformers import ViTConfig

    path.mkdir(parents=True, exist_ok=True)
    ViTConfig(
        image_size=image_size,
        patch_size=4,
        num_channels=channels,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    ).save_pretrained(path)
    return path / "config.json"


def test_a_config_json_without_a_processor_trains_from_scratch_on_images_of_its_size(job, tmp_path, capsys):
    rng = np.random.default_rng(2)
    data = tmp_path / "d"
    for colour in COLOURS:
        for i in range(8):
            make_image(data / colour / f"{i}.png", colour, rng, size=(16, 16))
    config = _vit_config_folder(tmp_path / "cfg", channels=1)
    result = train(job(model=str(config), data=str(data), max_steps=2, eval_fraction=0.5))
    saved = json.loads((result.model_dir / "leantrain_inputs.json").read_text())
    assert saved["resizes"] is False and saved["channels"] == 1
    from leantrain import evaluate, predict

    # predict and evaluate read the files the same way (grey, unresized) and agree on every one
    files = sorted(data.rglob("*.png"))
    rows = predict(str(result.output_dir), files=[str(f) for f in files])
    hits = [row["label"] == f.parent.name for row, f in zip(rows, files)]
    scored = evaluate(str(result.output_dir), str(data), cache_dir=str(tmp_path / "c2"))
    assert scored["examples"] == len(files) == 16 and scored["accuracy"] == pytest.approx(sum(hits) / len(hits))

    # the card's snippet serves the grey model: pipeline makes a file name RGB, which a one-channel model cannot take
    from PIL import Image
    from transformers import pipeline

    card = (result.model_dir / "README.md").read_text()
    assert 'model(np.asarray(Image.open("image.png").convert("L"))[..., None])' in card
    pipe = pipeline("image-classification", model=str(result.model_dir))
    served = pipe(np.asarray(Image.open(files[0]).convert("L"))[..., None], top_k=1)[0]
    assert served["label"] == rows[0]["label"] and served["score"] == pytest.approx(rows[0]["score"], abs=1e-4)


def test_mixed_sizes_without_a_processor_or_the_wrong_size_exit_2(tmp_path, capsys):
    rng = np.random.default_rng(3)
    data = tmp_path / "d"
    for colour in COLOURS:
        for i in range(4):
            make_image(data / colour / f"{i}.png", colour, rng, size=(16, 16) if i % 2 else (20, 20))
    config = _vit_config_folder(tmp_path / "cfg")
    args = ["train", "--model", str(config), "--data", str(data), "--cache-dir", str(tmp_path / "c"),
            "--output-dir", str(tmp_path / "r"), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "images of different sizes (" in err and "no image processor" in err and "Traceback" not in err
    assert "e.g. blue/0.png)" in err  # one of the odd size (20x20, not the model's 16x16), to look at

    for p in data.rglob("*.png"):
        make_image(p, p.parent.name, rng, size=(20, 20))
    assert main(args) == 2
    assert "images are 20x20 (e.g. blue/0.png) but the model takes 16x16" in capsys.readouterr().err


def test_a_table_of_image_paths_and_labels(job, image_folder, tmp_path):
    rows = [
        {"path": str(p.relative_to(image_folder)), "category": p.parent.name}
        for p in sorted(image_folder.rglob("*.png"))
    ]
    table = image_folder / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        result = train(job(data=str(table), label_column="category"))
    finally:
        table.unlink()
    # the images named in the `path` column are what it learns from: colour is all it takes
    assert result.metrics["num_labels"] == 2 and result.metrics["eval_accuracy"] == 1.0


def _write_idx(path: Path, array: np.ndarray, code: int) -> None:
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_are_a_source_like_mnist(job, tmp_path):
    rng = np.random.default_rng(4)
    labels = np.arange(40) % 2
    images = rng.integers(0, 40, (40, 28, 28)).astype(np.uint8)
    images[labels == 1, 8:20, 8:20] = 255  # a bright square: class 1
    folder = tmp_path / "idx"
    folder.mkdir()
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", images, 0x08)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", labels, 0x08)
    result = train(job(data=str(folder), epochs=4))
    assert result.metrics["eval_accuracy"] >= 0.9 and result.metrics["train_examples"] > 0
    with pytest.raises(DataError, match=r"is a folder of IDX files, not a table.*idx1 file holds the labels"):
        train(job(data=str(folder), label_column="label", output_dir=str(tmp_path / "r2")))

    from leantrain.data.images import read_idx

    (folder / "bad-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (5).to_bytes(4, "big") * 3 + b"\x00")
    with pytest.raises(DataError, match="truncated IDX"):
        read_idx(folder / "bad-images-idx3-ubyte")


def test_task_is_inferred_from_the_model_and_a_wrong_task_is_refused(tmp_path, capsys):
    from leantrain import tasks
    from leantrain.model import presets

    assert tasks.infer(presets.preset_config("preset:tiny-vit")) == "image-classification"
    assert tasks.infer(presets.preset_config("preset:tiny-audio")) == "audio-classification"
    from transformers import BertConfig

    assert tasks.infer(BertConfig()) == "text-classification"
    from transformers import PerceiverConfig, WhisperConfig

    # whisper can classify audio, or be its own decoder alone: audio, as documented; not its checkpoint's name's
    # task (seq2seq, which leantrain's cannot load it for), nor text classification (which it cannot do)
    for arch in (None, ["WhisperForConditionalGeneration"], ["WhisperForAudioClassification"]):
        assert tasks.infer(WhisperConfig(architectures=arch)) == "audio-classification"
    assert tasks.infer(PerceiverConfig()) == "text-classification"  # it classifies text and images alike
    code = main(["train", "--model", "preset:tiny-vit", "--task", "audio-classification", "--data", str(tmp_path),
                 "--output-dir", str(tmp_path / "r"), "--no-progress"])  # fmt: skip
    assert code == 2 and "cannot do it" in capsys.readouterr().err
    assert main(["train", "--model", "preset:nope", "--output-dir", str(tmp_path / "r2")]) == 2
    assert "known presets: preset:tiny-vit" in capsys.readouterr().err
    assert main(["info", "preset:tiny-vit", "--num-labels", "10"]) == 0
    assert "ViTForImageClassification" in capsys.readouterr().out


def test_augmentation_shifts_images_deterministically():
    import torch

    from leantrain.data.images import shift_images

    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    a = shift_images(x, np.random.default_rng(0))
    b = shift_images(x, np.random.default_rng(0))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, x)


def test_a_headerless_image_table_without_a_suffix_reads_with_format_and_column_names(job, image_folder):
    """--format and --column-names reach image tables as they reach text ones; the names given are the ones
    used (swapped, the image column holds class names and the file is refused)."""
    rows = [f"{p.parent.name}\t{p.relative_to(image_folder)}\n" for p in sorted(image_folder.rglob("*.png"))]
    table = image_folder / "listing"
    table.write_text("".join(rows))
    try:
        result = train(job(data=str(table), format="tsv", column_names="category,path", label_column="category"))
        assert result.metrics["num_labels"] == 2 and result.metrics["eval_accuracy"] == 1.0
        with pytest.raises(DataError, match="listing"):
            swapped = dict(format="tsv", column_names="path,category", label_column="category")
            train(job(data=str(table), output_dir=str(image_folder.parent / "swapped"), **swapped))
    finally:
        table.unlink()


def test_lora_trains_an_image_classifier_and_publishes_a_merged_model(job, image_folder):
    """LoRA (issue #15) on the image task: the adapters and the classifier train, the patch embeddings stay as
    initialised (the same seed builds the same start), and model/ is a plain ViT that pipeline() loads."""
    from safetensors.torch import load_file
    from transformers import pipeline

    result = train(job(data=str(image_folder), lora=True, lora_r=4, lr=1e-2, epochs=4))
    start = train(
        job(
            data=str(image_folder),
            lora=True,
            lora_r=4,
            lr=1e-30,
            max_steps=1,
            output_dir=str(result.output_dir) + "-start",
        )
    )
    assert result.metrics["eval_accuracy"] == 1.0
    trained, initial = (
        load_file(result.model_dir / "model.safetensors"),
        load_file(start.model_dir / "model.safetensors"),
    )
    assert sorted(trained) == sorted(initial) and not any("lora" in k for k in trained)
    frozen = [k for k in trained if "embeddings" in k]
    assert frozen and all(torch.equal(trained[k], initial[k]) for k in frozen)
    assert not torch.equal(trained["classifier.weight"], initial["classifier.weight"])
    clf = pipeline("image-classification", model=str(result.model_dir))
    assert clf(str(image_folder / "red" / "3.png"))[0]["label"] == "red"


def test_image_folders_mix_by_examples_and_by_tokens_is_refused_in_one_line(image_folder, job, tmp_path, capsys):
    import shutil

    more = shutil.copytree(image_folder / "red", tmp_path / "more" / "red")  # one class: fine in a mixture
    result = train(job(data=[f"{image_folder}@0.5", f"{more.parent}@0.5"], epochs=1))
    drawn = result.metrics["sources"]
    assert set(drawn) == {image_folder.name, "more"} and drawn["more"]["eval_accuracy"] is not None
    assert drawn["more"]["share_examples"] == pytest.approx(0.5, abs=0.1)
    argv = ["train", "--model", "preset:tiny-vit", "--data", str(image_folder), "--data", str(more.parent)]
    capsys.readouterr()
    code = main([*argv, "--mix-by", "tokens", "--output-dir", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--mix-by tokens: image-classification has no tokens" in err[0], err


@pytest.mark.parametrize("held_by", ["eval-data", "eval-pattern"])
def test_evaluation_files_of_a_class_training_lacks_exit_2(image_folder, tmp_path, capsys, held_by):
    rng = np.random.default_rng(4)
    data = tmp_path / "train"
    for colour in COLOURS:
        for i in range(4):
            make_image(data / colour / f"{i}.png", colour, rng)
    held = tmp_path / "eval" if held_by == "eval-data" else data
    make_image(held / "green" / "0.png", "blue", rng)
    make_image(held / "red" / "9.png", "red", rng)
    extra = ["--eval-data", str(held)] if held_by == "eval-data" else ["--eval-pattern", "^green/"]
    args = ["train", "--model", "preset:tiny-vit", "--data", str(data), *extra, "--cache-dir", str(tmp_path / "c"),
            "--output-dir", str(tmp_path / "r"), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "labels ['green'] never occur in the training data" in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["I;16", "I"])
def test_a_16_bit_grey_image_keeps_its_grey_levels(tmp_path, mode):
    """Pillow's own conversion clips 16-bit levels at 255: mid-grey would be read as white."""
    from PIL import Image

    from leantrain.data.images import decode_image

    levels = np.arange(0, 256, dtype=np.uint8).reshape(16, 16)
    wide = levels.astype(np.uint16) * 257  # the same picture, 16 bits a pixel
    path = tmp_path / ("grey16.png" if mode == "I;16" else "grey32.tif")  # PNG cannot hold mode I
    image = Image.fromarray(wide) if mode == "I;16" else Image.fromarray(wide.astype(np.int32), "I")
    image.save(path)
    assert Image.open(path).mode == mode
    for channels in (1, 3):
        got = decode_image(str(path), channels)
        assert got.shape == (16, 16, channels)
        assert np.array_equal(got[..., 0], levels)


def test_the_python_api_takes_paths_and_refuses_wrong_types_in_one_line(job, image_folder):
    """A Path is one file as a string is; a value of the wrong type is a LeantrainError naming the argument, not a
    TypeError (or a KeyError) from deep inside, and a batch size of 0 is refused, not taken for the default."""
    from leantrain import evaluate, predict
    from leantrain.errors import ConfigError

    run = train(job(data=str(image_folder), max_steps=1)).output_dir
    image = image_folder / "red" / "0.png"
    rows = predict(run, files=image)
    assert [r["file"] for r in rows] == [str(image)]
    assert predict(str(run), files=(p for p in [image, str(image)])) == rows * 2
    assert evaluate(run, image_folder)["examples"] == 48
    for call, needle in [
        (lambda: predict(run, files=[image, 3]), "files must be a path or a list of them, got int 3"),
        (lambda: predict(run, files=3), "files must be a path or a list of them, got int 3"),
        (lambda: predict(run, files=[]), "files is empty; give at least one"),  # not "none of the 0 ... read"
        (lambda: predict(run, texts=["fine", ""]), "--text '' is empty"),
        (lambda: predict(run, files=image, batch_size=-1), "--batch-size must be a positive integer, got -1"),
        (lambda: evaluate(run, image_folder, batch_size=0), "--batch-size must be a positive integer, got 0"),
        (lambda: evaluate(run, image_folder, batch_size="8"), "--batch-size must be a positive integer, got '8'"),
        (lambda: evaluate(run, 123), "evaluate(): data must be a path (str or Path), got int 123"),
        (lambda: evaluate(run, image_folder, read={"format": "csv"}), "read must be a"),
    ]:
        with pytest.raises(ConfigError) as info:
            call()
        assert needle in str(info.value)


def test_a_cached_source_is_named_by_the_path_given_now(image_folder, tmp_path):
    """Cache entries are found by content: the same files under another path were named by the path that cached
    them (a run on /abs/data said `../data: 48 rows`)."""
    import shutil

    from leantrain.data.media import IMAGE, MediaProcessor, load_media_source
    from leantrain.model.presets import preset_processor

    copy = tmp_path / "copy"
    shutil.copytree(image_folder, copy)  # names, sizes and modification times kept: the same cache entry
    mp = MediaProcessor(IMAGE, preset_processor("preset:tiny-vit"))
    first = load_media_source(str(image_folder), mp, tmp_path / "cache")
    again = load_media_source(str(copy), mp, tmp_path / "cache")
    assert again.cache_hit and not first.cache_hit
    assert again.path == str(copy) and again.describe().startswith(f"{copy}: 48 rows")


def test_a_photo_is_read_upright_as_its_exif_orientation_says(tmp_path):
    """A phone stores a portrait photo sideways with an EXIF orientation; transformers' pipeline turns it upright,
    so training must too, or the published model predicts on other pictures than it learned from."""
    from PIL import Image

    from leantrain.data.images import decode_image

    rng = np.random.default_rng(7)
    upright = rng.integers(0, 255, (12, 20, 3), dtype=np.uint8)  # 12 high, 20 wide
    stored = Image.fromarray(np.ascontiguousarray(np.rot90(upright, k=1)))  # as the camera wrote it: turned
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    stored.save(tmp_path / "photo.png", exif=exif)
    got = decode_image(str(tmp_path / "photo.png"), 3)
    assert got.shape == (12, 20, 3) and np.array_equal(got, upright)
