"""The command line: every bad input ends in one line naming the file/flag/column, exit 2, no traceback."""

import gc
import json
import shutil
import subprocess
import sys

import pytest

from leantrain.commands.cli import main
from tests.conftest import make_sentiment_rows, write_csv


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture()
def base(tiny_model_dir, sentiment_csv, tmp_path, cache_dir):
    return [
        "train",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(sentiment_csv),
        "--output-dir",
        str(tmp_path / "run"),
        "--cache-dir",
        str(cache_dir),
        "--no-progress",
        "--no-report",  # its rendering was 26 s of this file's 46 s (load 3.5); tests/telemetry checks the report
        "--precision",
        "fp32",
    ]


def _one_line_error(code, err, *needles):
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["evaluate", "RUN", "--eval-data", "x.csv"], "unknown flag --eval-data; did you mean --data?"),
        (
            ["predict", "RUN", "--text", "hi", "--save-every", "3"],
            "`leantrain predict` takes no --save-every (a flag of",
        ),
        # another command's flag is named as such, not taken for a look-alike (--format, --image-column)
        (["predict", "RUN", "--file", "x.png", "--lora"], "`leantrain predict` takes no --lora (a flag of"),
        (["predict", "RUN", "--data", "d", "--label-column", "y"], "`leantrain predict` takes no --label-column"),
        (["train", "--batch-sise", "8"], "did you mean --batch-size?"),
        # a prefix is a typo, not the flag it begins: `--epoch 3` told, never read as --epochs
        (["train", "--epoch", "3"], "unknown flag --epoch; did you mean --epochs?"),
        (["train", "--max-step=3"], "unknown flag --max-step; did you mean --max-steps?"),
        # read only with their switch: before any process starts or data is read
        (["train", "--data", "x.csv", "--lora-r", "4", "--num-processes", "2"], "--lora-r needs --lora"),
        (["train", "--data", "x.csv", "--muon-lr", "0.01", "--print-config"], "--muon-lr needs --optimizer muon"),
    ],
)
def test_a_flag_the_command_does_not_take_is_named_with_the_commands_own(capsys, argv, needle):
    """The hint comes from the command's own flags: never "did you mean" the very flag typed (another command's)."""
    code, _, err = run(capsys, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"leantrain {argv[0]}: error: "), err  # as every other refusal of the command begins


@pytest.mark.parametrize(
    "change,needles",
    [
        (["--data", "missing.csv"], ["missing.csv", "no such file"]),
        (["--data", "{tmp}/notes.xyz"], ["notes.xyz", "unknown format"]),
        (["--data", "{tmp}/empty.csv"], ["empty.csv", "empty"]),
        (["--data", "{tmp}/nolabel.csv"], ["nolabel.csv", "--label-column"]),
        (["--data", "{tmp}/test.tsv"], ["test.tsv", "no label column", "leantrain predict RUN --data"]),
        (
            ["--data", "{tmp}/sms", "--format", "tsv"],
            ["sms", "first line looks like data", "--column-names label,text"],
        ),
        (["--data", "{tmp}/corpus.txt"], ["corpus.txt", "unknown format", "--format conll", "--task causal-lm"]),
        (["--data", "{tmp}/photos"], ["photos", "a folder of image files", "--model preset:tiny-vit"]),
        (["--task", "causal-lm", "--data", "{tmp}/corpus.txt"], ["no EOS token", "encoder", "preset:tiny-llama"]),
        (["--data", "{tmp}/ambiguous.csv"], ["ambiguous.csv", "--text-column"]),
        (["--data", "{tmp}/oneclass.csv"], ["oneclass.csv", "single class"]),
        (["--label-column", "stars"], ["no column 'stars'", "--label-column"]),
        (["--model", "{tmp}"], ["holds no model"]),
        (["--batch-size", "0"], ["--batch-size", "positive"]),
        (["--max-length", "-5"], ["--max-length", "positive"]),
        (["--max-length", "100000"], ["--max-length 100000", "supports"]),
        (["--eval-fraction", "1.5"], ["--eval-fraction"]),
        (["--eval-data", "{data}", "--eval-fraction", "0.2"], ["--eval-fraction 0.2", "--eval-data", "leave"]),
        # a second choice of evaluation files beside --eval-pattern was ignored: the run held out the pattern's files
        (["--eval-pattern", "_0", "--eval-data", "{data}"], ["--eval-pattern '_0'", "--eval-data gives", "leave one"]),
        (["--eval-pattern", "_0", "--eval-fraction", "0.2"], ["--eval-fraction 0.2", "--eval-pattern picks", "leave"]),
        (["--batch-size", "abc"], ["--batch-size", "integer"]),
        (["--batch-sise", "8"], ["unknown flag --batch-sise", "did you mean --batch-size"]),
        (["--progress", "off"], ["--progress takes no value (got 'off'): use --progress or --no-progress"]),
        (["--config", "{tmp}/bad.yaml"], ["bad.yaml", "unknown key 'lrate'"]),
        # mixtures (docs/mixtures.md): weights, sources that hold nothing
        (["--data", "{data}@0", "--data", "{tmp}/other.csv@1"], ["sentiment.csv@0", "weight must be a positive"]),
        (["--data", "{data}@-0.5", "--data", "{tmp}/other.csv@1"], ["@-0.5", "weight must be a positive"]),
        (["--data", "{data}@lots", "--data", "{tmp}/other.csv@1"], ["weight 'lots' is not a number"]),
        (["--data", "{data}@nan", "--data", "{tmp}/other.csv@1"], ["weight must be a positive"]),
        (["--data", "{data}@0.7", "--data", "{tmp}/other.csv"], ["weights are given for some", "other.csv"]),
        (["--data", "{data}", "--data", "{tmp}/sub/sentiment.csv"], ["two sources are named 'sentiment'"]),
        (["--data", "{data}", "--data", "{tmp}/copy.csv", "--dedupe"], ["copy.csv", "yields no training rows"]),
        (["--data", "{data}", "--data", "{tmp}/empty.csv"], ["empty.csv", "empty"]),
        (["--data", "{data}", "--data", "{tmp}/other.csv", "--mix-by", "words"], ["--mix-by", "examples, tokens"]),
        (["--data", "{data}", "--data", "{tmp}/other.csv", "--eval-data", "{data}"], ["--eval-data with several"]),
        (["--data", "{data}", "--data", "{{path: {tmp}/other.csv, wieght: 2}}"], ["unknown key 'wieght'", "weight"]),
    ],
)
def test_bad_input(capsys, base, tmp_path, change, needles):
    (tmp_path / "notes.xyz").write_text("a,b\n")
    (tmp_path / "empty.csv").write_text("")
    write_csv(tmp_path / "nolabel.csv", [("good", "4")], header=("text", "stars"))
    write_csv(tmp_path / "ambiguous.csv", [("good", "bad", "1")], header=("title", "summary", "label"))
    write_csv(tmp_path / "oneclass.csv", [("good", "1"), ("fine", "1")])
    (tmp_path / "bad.yaml").write_text("lrate: 0.1\n")
    write_csv(tmp_path / "other.csv", make_sentiment_rows(40, seed=9))
    (tmp_path / "sub").mkdir()
    write_csv(tmp_path / "sub" / "sentiment.csv", make_sentiment_rows(40, seed=9))
    (tmp_path / "test.tsv").write_text("index\tsentence\n0\tuneasy mishmash of styles .\n1\ta fine film\n")
    (tmp_path / "sms").write_text(
        "ham\tGo until jurong point, crazy.. Available only\nspam\tFree entry in 2 a wkly comp\n"
    )
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "0.png").write_bytes(b"not read")
    (tmp_path / "corpus.txt").write_text("A first document.\n\nA second one.\n")
    shutil.copy(base[base.index("--data") + 1], tmp_path / "copy.csv")  # every row a duplicate of the first source's
    argv = without_data(base) if "--data" in change else base
    argv = argv + [c.format(tmp=tmp_path, data=base[base.index("--data") + 1]) for c in change]
    code, _, err = run(capsys, *argv)
    _one_line_error(code, err, *needles)
    assert not (tmp_path / "run" / "metrics.json").exists()


def without_data(argv: list[str]) -> list[str]:
    """The job without its --data: a second --data would mix the two sources (docs/mixtures.md)."""
    i = argv.index("--data")
    return argv[:i] + argv[i + 2 :]


def test_finished_run_is_refused_without_overwrite(capsys, base):
    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    code, _, err = run(capsys, *base, "--max-steps", "1")
    _one_line_error(code, err, "holds a finished run", "--overwrite")


def test_a_run_folder_given_as_data_is_refused_naming_the_data_it_trained_on(capsys, base, tmp_path, sentiment_csv):
    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    again = [*base, "--output-dir", str(tmp_path / "again"), "--data", str(tmp_path / "run"), "--max-steps", "1"]
    code, _, err = run(capsys, *again)
    _one_line_error(code, err, "a leantrain run's folder, not data", f"this run trained on {sentiment_csv}", "evaluate")


def test_train_evaluate_predict_round_trip(capsys, base, tmp_path, sentiment_csv):
    code, out, _ = run(capsys, *base, "--epochs", "4", "--lr", "3e-3", "--warmup-ratio", "0")
    assert code == 0 and "accuracy" in out
    run_dir = str(tmp_path / "run")

    code, out, _ = run(capsys, "evaluate", run_dir, "--data", str(sentiment_csv))
    metrics = json.loads(out)
    assert code == 0 and metrics["examples"] == 240 and metrics["accuracy"] > 0.8

    code, out, _ = run(capsys, "predict", run_dir, "--text", "a wonderful superb film", "--text", "awful and boring")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["label"] for r in rows] == ["pos", "neg"]
    assert sum(rows[0]["probabilities"].values()) == pytest.approx(1, abs=1e-4)

    target = tmp_path / "pred.csv"
    code, out, err = run(capsys, "predict", run_dir, "--data", str(sentiment_csv), "--output", str(target))
    assert out == "" and f"written: {target} (240 predictions)" in err  # said, and stdout left for results
    import pandas as pd

    pred = pd.read_csv(target)
    assert code == 0 and len(pred) == 240 and {"text", "label", "score", "p_pos", "p_neg"} <= set(pred.columns)

    # a headerless TSV without a suffix, read as `train` reads it (--format, --column-names)
    bare = tmp_path / "bare"
    bare.write_text("".join(f"{label}\t{text}\n" for text, label in pd.read_csv(sentiment_csv).values))
    read = ["--format", "tsv", "--column-names", "label,text"]
    code, out, _ = run(capsys, "evaluate", run_dir, "--data", str(bare), *read)
    assert code == 0 and json.loads(out)["accuracy"] == metrics["accuracy"]
    code, out, _ = run(capsys, "predict", run_dir, "--data", str(bare), *read)
    assert code == 0 and [json.loads(line)["label"] for line in out.splitlines()] == pred["label"].tolist()


def test_evaluate_refuses_labels_the_model_does_not_know(capsys, base, tmp_path):
    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    other = write_csv(tmp_path / "other.csv", [("good", "pos"), ("so-so", "neutral")])
    code, _, err = run(capsys, "evaluate", str(tmp_path / "run"), "--data", str(other))
    _one_line_error(code, err, "other.csv", "'neutral'", "unknown to the model")


@pytest.mark.parametrize("text", ["", "  \t"], ids=["empty", "whitespace"])
def test_predict_refuses_an_empty_text_which_a_classifier_would_label(capsys, tiny_model_dir, tmp_path, text):
    """A classifier labels an empty text as readily as any: refused as the flag it is, one line, nothing predicted."""
    _saved_classifier(tiny_model_dir, tmp_path / "model", ["neg", "pos"])
    capsys.readouterr()  # the save's progress bar
    code, out, err = run(capsys, "predict", str(tmp_path / "model"), "--text", "a fine film", "--text", text)
    _one_line_error(code, err, f"--text {text!r} is empty", "leave that --text out")
    assert out == ""


def test_predict_refuses_an_output_it_cannot_write_before_predicting(capsys, tmp_path):
    """Checked first: the run named here does not even exist, and the error is the output's, in one line."""
    missing = str(tmp_path / "no-run")
    code, _, err = run(capsys, "predict", missing, "--text", "hi", "--output", str(tmp_path / "p.xlsx"))
    _one_line_error(code, err, "--output", "unknown format '.xlsx'", ".jsonl, .json, .csv, .tsv")
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "predict", missing, "--text", "hi", "--output", str(blocker / "p.csv"))
    _one_line_error(code, err, "--output", "cannot create its folder")
    from leantrain.errors import DataError
    from leantrain.inference import write_predictions

    (tmp_path / "taken.csv").mkdir()  # a folder where the file should go: found only at the write
    with pytest.raises(DataError, match=r"--output .*taken\.csv: cannot write"):
        write_predictions([{"text": "hi", "label": "pos"}], str(tmp_path / "taken.csv"), None)
    write_predictions([{"text": "hi", "label": "pos"}], str(tmp_path / "new" / "p.jsonl"), None)
    assert json.loads((tmp_path / "new" / "p.jsonl").read_text()) == {"text": "hi", "label": "pos"}


def test_predict_with_a_model_that_does_not_load_leaves_no_output_folder(capsys, tmp_path):
    out = tmp_path / "new" / "folder" / "p.jsonl"
    code, _, err = run(capsys, "predict", str(tmp_path / "no-run"), "--text", "hi", "--output", str(out))
    _one_line_error(code, err, "no-run")
    assert not (tmp_path / "new").exists()


def test_info_shows_config_counts_and_head(capsys, tiny_model_dir):
    code, out, _ = run(capsys, "info", str(tiny_model_dir), "--num-labels", "5")
    assert code == 0
    assert '"hidden_size": 64' in out and "BertConfig" in out
    assert "trainable" in out and "in embeddings" in out
    assert "classifier: Linear(64 -> 5)" in out


def test_a_vits_learned_positions_and_class_token_count_as_embeddings_its_patch_projection_outside():
    """A ViT has no lookup table: its embeddings are the positions and class token its embeddings module holds
    (`leantrain info` said 0 in embeddings); the patch projection multiplies, so it counts outside them."""
    from transformers import BertConfig, BertForSequenceClassification, ViTConfig, ViTForImageClassification

    from leantrain.model.loading import count_parameters

    vit = ViTForImageClassification(
        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8)
    )  # fmt: skip
    assert count_parameters(vit).embeddings == (1 + 16) * 32 + 32  # positions of the class token and 16 patches
    bert = BertForSequenceClassification(
        BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    tables = bert.bert.embeddings
    expected = sum(
        t.weight.numel() for t in (tables.word_embeddings, tables.position_embeddings, tables.token_type_embeddings)
    )
    assert count_parameters(bert).embeddings == expected  # its LayerNorm outside, as before


TINY_BERT = dict(
    vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    max_position_embeddings=64,
)  # fmt: skip


@pytest.mark.parametrize(
    ("head", "labels", "problem", "shown"),
    [
        ("BertForSequenceClassification", ["neg", "neu", "pos"], None, "3 (single-label): neg, neu, pos"),
        ("BertForSequenceClassification", ["a", "b", "c"], "multi_label_classification", "3 (multi-label): a, b, c"),
        ("BertForSequenceClassification", ["reward"], "regression", "1 (regression): reward"),
        ("BertForTokenClassification", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], None, "5 (single-label): O, B-PER"),
    ],
)
def test_info_describes_a_trained_classifier_with_its_own_head(capsys, tmp_path, head, labels, problem, shown):
    import transformers

    config = transformers.BertConfig(**TINY_BERT, id2label=dict(enumerate(labels)), problem_type=problem)
    getattr(transformers, head)(config).save_pretrained(tmp_path / "run" / "model")
    (tmp_path / "run" / "config.yaml").write_text("task: text-classification\n")
    for where in ("run", "run/model"):  # a run directory, or its model folder
        code, out, err = run(capsys, "info", str(tmp_path / where))
        assert code == 0, err
        assert f"architecture     {head}" in out
        assert f"classifier: Linear(32 -> {len(labels)})" in out and "(new" not in out
        assert f"labels           {shown}" in out
    # --num-labels is for a new head: a trained one is shown as it is, and the user told so
    code, out, err = run(capsys, "info", str(tmp_path / "run"), "--num-labels", "7")
    assert code == 0 and f"classifier: Linear(32 -> {len(labels)})" in out
    assert "--num-labels 7 does not apply" in err and f"({len(labels)} labels)" in err


def test_info_refuses_weights_that_do_not_fit_their_config_in_one_line(capsys, tmp_path):
    import json

    from transformers import BertConfig, BertForSequenceClassification

    BertForSequenceClassification(BertConfig(**TINY_BERT, num_labels=3)).save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    saved["id2label"] = {str(i): f"L{i}" for i in range(4)}  # edited by hand: 4 labels, weights for 3
    (tmp_path / "m" / "config.json").write_text(json.dumps(saved))
    capsys.readouterr()  # the bar of saving it
    code, _, err = run(capsys, "info", str(tmp_path / "m"))
    _one_line_error(code, err, str(tmp_path / "m"), "other sizes than the config gives")


@pytest.mark.parametrize("kind", ["causal-lm", "seq2seq"])
def test_info_describes_a_language_model_without_labels(capsys, tmp_path, kind):
    import transformers

    if kind == "causal-lm":
        config = transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2)
        model = transformers.T5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path / "m")
    code, out, err = run(capsys, "info", str(tmp_path / "m"))
    assert code == 0, err
    assert "(2 labels)" not in out and "labels" not in out.split("architecture")[1]
    assert "head             lm_head: Linear(32 -> 100) (a score per vocabulary token)" in out
    assert f"architecture     {type(model).__name__} ({kind})" in out


def test_env_reports_devices_precisions_and_versions(capsys):
    code, out, _ = run(capsys, "env")
    assert code == 0
    for needle in (
        "device",
        "distributed type",
        "processes",
        "bf16",
        "fp16",
        "--precision auto",
        "torch",
        "transformers",
        "accelerate",
        "datasets",
    ):
        assert needle in out


@pytest.mark.slow  # launches a Python process
def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "leantrain", "train", "--data", str(tmp_path / "nope.csv")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("leantrain train: error: ")


def _probe(argv: list[str], main: str | None = None) -> subprocess.CompletedProcess:
    """`python -m leantrain ARGV` in a child that reports, at its exit, whether cyclic garbage collection was on
    and how many objects were frozen; `main` replaces `cli.main` (a Python expression)."""
    code = (
        "import atexit, gc, runpy, sys, leantrain.commands.cli as cli\n"
        "frozen = lambda: gc.get_freeze_count() > 1000\n"
        "atexit.register(lambda: print('at exit: collecting', gc.isenabled(), 'frozen', frozen()))\n"
        + (f"cli.main = lambda: {main}\n" if main else "")
        + f"sys.argv = ['leantrain', *{argv!r}]\n"
        "runpy.run_module('leantrain', run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_the_command_collects_no_garbage_at_start_up_nor_at_its_exit(base):
    """`leantrain` and `python -m leantrain` end through `entry`: `train` starts with cyclic collection off, and the
    first training micro-batch freezes what start-up made and turns it on again; at the exit every object is frozen
    (Python's last collection then walks none). `main` itself, which tests call in one process, touches nothing."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "leantrain"]
    assert script.value == "leantrain.commands.cli:entry"
    report = (
        "print('in main: collecting', __import__('gc').isenabled(), 'frozen', __import__('gc').get_freeze_count()) or 7"
    )
    for command, collecting in (("train", False), ("predict", True)):
        proc = _probe([command], main=report)
        assert proc.returncode == 7, proc.stderr  # main's exit code
        assert f"in main: collecting {collecting} frozen 0" in proc.stdout
        assert "at exit: collecting" in proc.stdout and "frozen True" in proc.stdout
    proc = _probe(base)  # a real run: collection back on since its first micro-batch
    assert proc.returncode == 0, proc.stderr
    assert "at exit: collecting True frozen True" in proc.stdout
    assert gc.isenabled() and gc.get_freeze_count() == 0  # this process: untouched by the runs `main` made


def test_yaml_config_with_flag_override(capsys, tiny_model_dir, sentiment_csv, tmp_path, cache_dir):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"model: {tiny_model_dir}\ndata: {sentiment_csv}\nmax_steps: 5\nbatch_size: 8\n"
        f"cache_dir: {cache_dir}\nprecision: fp32\nprogress: false\n"
    )
    code, _, _ = run(capsys, "train", "--config", str(cfg), "--max-steps", "2", "--output-dir", str(tmp_path / "r"))
    assert code == 0
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 2
    import yaml

    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["batch_size"] == 8


# --- data sources and bad input in files (issues #18, #19.6, #19.12, #20.13) ---------------------------

from dataclasses import fields as _fields  # noqa: E402

from leantrain.config import TrainConfig, field_base_type  # noqa: E402


def _numeric_fields() -> list[tuple[str, type]]:
    """Every int or float config field: a new numeric flag is covered without editing this test."""
    return [(f.name, field_base_type(f)) for f in _fields(TrainConfig) if field_base_type(f) in (int, float)]


def _bad_values(kind: type) -> list[str]:
    return ["abc", "", "1,5", "0x"] + (["1.5", "1e3x"] if kind is int else ["1..2", "one"])


def test_numeric_fields_are_found():
    names = [name for name, _ in _numeric_fields()]
    assert {"batch_size", "lr", "max_length", "eval_fraction", "max_seconds"} <= set(names) and len(names) > 20


@pytest.mark.parametrize("name,kind", _numeric_fields(), ids=[n for n, _ in _numeric_fields()])
def test_bad_types_for_every_numeric_flag_and_key(capsys, tmp_path, name, kind):
    flag = "--" + name.replace("_", "-")
    for value in _bad_values(kind):
        code, _, err = run(capsys, "train", f"{flag}={value}")
        _one_line_error(code, err, flag, "integer" if kind is int else "number")
    for value in ["abc", [1], {"a": 1}, True] + ([1.5] if kind is int else []):
        job = tmp_path / "job.yaml"
        job.write_text(json.dumps({name: value}))  # JSON is YAML
        code, _, err = run(capsys, "train", "--config", str(job))
        _one_line_error(code, err, flag, "integer" if kind is int else "number")


@pytest.mark.parametrize(
    "content,needles",
    [
        ("lr: 0.1\nmodel: caf\xe9\n".encode("latin-1"), ["job.yaml", "not UTF-8 text", "0xe9", "save it as UTF-8"]),
        (b"lr: [0.1\nbatch_size: 8\n", ["job.yaml", "not valid YAML"]),
        (b"lr: 0.1\n  batch_size: 8\n", ["job.yaml", "not valid YAML"]),
        (b"- lr\n- 0.1\n", ["job.yaml", "expected a mapping"]),
        (b"\xff\xfel\x00r\x00", ["job.yaml", "not UTF-8 text"]),
    ],
)
def test_bad_config_files_are_one_line(capsys, tmp_path, content, needles):
    job = tmp_path / "job.yaml"
    job.write_bytes(content)
    code, _, err = run(capsys, "train", "--config", str(job))
    _one_line_error(code, err, *needles)


def test_a_config_file_with_a_utf8_byte_order_mark_is_read(tmp_path):
    from leantrain.config import TrainConfig

    job = tmp_path / "job.yaml"
    job.write_bytes(b"\xef\xbb\xbfbatch_size: 8\ndata_config: sst2\n")
    cfg = TrainConfig.from_yaml(job)
    assert (cfg.batch_size, cfg.data_config) == (8, "sst2")


@pytest.mark.parametrize(
    "change,needles",
    [
        (["--format", "xlsx"], ["--format", "csv, tsv, json, jsonl, parquet", "'xlsx'"]),
        (["--column-names", "label,,text"], ["--column-names", "empty name"]),
        (["--column-names", "a,b,a"], ["--column-names", "names a more than once"]),
        (["--column-names", "a,b", "--format", "json"], ["--column-names", "CSV/TSV"]),
        (["--data-config", " "], ["--data-config", "empty"]),
    ],
)
def test_bad_data_source_flags(capsys, change, needles):
    code, _, err = run(capsys, "train", *change)
    _one_line_error(code, err, *needles)


def _write_bad_file(tmp_path, kind: str) -> str:
    import random

    if kind == "random.parquet":
        (tmp_path / kind).write_bytes(random.Random(2).randbytes(3000))
    elif kind == "binary.csv":
        (tmp_path / kind).write_bytes(random.Random(3).randbytes(3000))
    elif kind == "scores.csv":
        write_csv(tmp_path / kind, [(f"pair {i}", f"{i / 7:.2f}") for i in range(40)], header=("text", "score"))
    elif kind == "broken-ds":
        import datasets

        datasets.Dataset.from_dict({"text": ["x y", "z"], "label": [1, 0]}).save_to_disk(str(tmp_path / kind))
        for arrow in (tmp_path / kind).glob("*.arrow"):
            arrow.write_bytes(b"\x00" * 64)
    return str(tmp_path / kind)


@pytest.mark.parametrize(
    "kind,extra,needles",
    [
        ("random.parquet", [], ["random.parquet", "not a readable Parquet file"]),
        ("binary.csv", [], ["binary.csv", "not a text file"]),
        ("scores.csv", ["--label-column", "score"], ["scores.csv", "'score'", "--problem-type regression"]),
        ("broken-ds", [], ["broken-ds", "cannot read this save_to_disk folder"]),
    ],
)
def test_bad_data_files_are_one_line(capsys, base, tmp_path, kind, extra, needles):
    argv = [*base, *extra]
    argv[argv.index("--data") + 1] = _write_bad_file(tmp_path, kind)
    capsys.readouterr()  # datasets' own progress bar while writing the folder
    code, _, err = run(capsys, *argv)
    _one_line_error(code, err, *needles)


def test_a_truncated_model_safetensors_is_one_line(capsys, base, tiny_model_dir, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    argv = list(base)
    argv[argv.index("--model") + 1] = str(model)
    code, _, err = run(capsys, *argv)
    # the data is read first, and says so; then one error line
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [err.strip().splitlines()[-1]]
    assert str(model) in err.strip().splitlines()[-1] and "cannot load" in err.strip().splitlines()[-1]


def test_train_on_a_headerless_file_without_suffix(capsys, base, tmp_path):
    from tests.conftest import make_sentiment_rows

    data = tmp_path / "SMSlike"
    data.write_text("".join(f"{label}\t{text}\n" for text, label in make_sentiment_rows(60)))
    argv = list(base)
    argv[argv.index("--data") + 1] = str(data)
    code, _, err = run(capsys, *argv, "--max-steps", "1")
    _one_line_error(code, err, "SMSlike", "--format")
    code, _, err = run(capsys, *argv, "--max-steps", "1", "--format", "tsv", "--column-names", "label,text")
    assert code == 0 and "SMSlike: 60 rows; columns text='text', label='label'" in err
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["num_labels"] == 2


def test_train_on_a_data_set_configuration_and_split(capsys, base, tmp_path, monkeypatch):
    """--data NAME:CONFIG and --eval-data NAME --data-config CONFIG, offline, on a local `datasets` folder."""
    import datasets
    import pandas as pd

    from tests.conftest import make_sentiment_rows

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    root = tmp_path / "glue"
    (root / "sst2").mkdir(parents=True)
    rows = make_sentiment_rows(50)
    pd.DataFrame(rows[:40], columns=["sentence", "label"]).to_csv(root / "sst2" / "train.csv", index=False)
    pd.DataFrame(rows[40:], columns=["sentence", "label"]).to_csv(root / "sst2" / "validation.csv", index=False)
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: sst2\n  data_files:\n  - split: train\n    path: sst2/train.csv\n"
        "  - split: validation\n    path: sst2/validation.csv\n- config_name: b\n  data_files: sst2/train.csv\n---\n"
    )
    argv = list(base)
    argv[argv.index("--data") + 1] = f"{root}:sst2"
    code, _, err = run(capsys, *argv, "--eval-data", str(root), "--data-config", "sst2", "--max-steps", "1")
    assert code == 0 and f"{root}:sst2: 40 rows" in err and f"{root}:sst2: 10 rows" in err
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["num_labels"] == 2
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "run2")  # a fresh folder: the refusal is the only line
    code, _, err = run(capsys, *argv, "--data-split", "test")
    _one_line_error(code, err, "no split 'test' (given by --data-split)", "train, validation")


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--data-split", "validation"], ["--data-split validation:", "is a single file and has no splits", "--data"]),
        (["--data-config", "sst2"], ["--data-config sst2:", "has no configurations", "leave --data-config out"]),
        (["--eval-split", "test"], ["--eval-split test:", "a single file", "give the split's own file to --eval-data"]),
    ],
    ids=["data-split", "data-config", "eval-split"],
)
def test_a_split_or_configuration_of_a_single_file_is_refused_not_ignored(capsys, base, sentiment_csv, flags, needles):
    """A CSV has no splits: `--data train.csv --data-split validation` would train on all of it without a word."""
    code, _, err = run(capsys, *base, "--eval-data", str(sentiment_csv), *flags, "--max-steps", "1")
    _one_line_error(code, err, str(sentiment_csv), *needles)


def test_evaluate_reads_a_recorded_split_of_a_single_file_and_refuses_one_given(capsys, base, tmp_path, sentiment_csv):
    """A run of an older leantrain recorded such values; they were never read, and evaluate and predict still work.
    Given to evaluate or predict now (--split, --data-config), they are refused as train refuses them."""
    import yaml

    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    saved = tmp_path / "run" / "config.yaml"
    values = yaml.safe_load(saved.read_text())
    values.update(data_split="validation", data_config="sst2", eval_data=str(sentiment_csv), eval_split="test")
    values.update(eval_pattern="_[0-4]$")  # beside --eval-data: ignored then, refused by train now
    saved.write_text(yaml.safe_dump(values, sort_keys=False))
    code, out, err = run(capsys, "evaluate", str(tmp_path / "run"))
    assert code == 0 and json.loads(out)["examples"] == 240, err
    code, out, err = run(capsys, "evaluate", str(tmp_path / "run"), "--data", str(sentiment_csv))
    assert code == 0 and json.loads(out)["examples"] == 240, err
    code, out, err = run(capsys, "predict", str(tmp_path / "run"), "--text", "a fine film")
    assert code == 0 and json.loads(out)["label"] in ("pos", "neg"), err
    code, _, err = run(capsys, "evaluate", str(tmp_path / "run"), "--data", str(sentiment_csv), "--split", "test")
    _one_line_error(code, err, f"--split test: {sentiment_csv} is a single file and has no splits", "to --data")
    code, _, err = run(capsys, "predict", str(tmp_path / "run"), "--data", str(sentiment_csv), "--data-config", "x")
    _one_line_error(code, err, "--data-config x:", "has no configurations; leave --data-config out")


def test_a_format_or_column_names_a_folder_ignores_is_refused_but_a_recorded_one_is_read_back(
    capsys, base, tmp_path, sentiment_csv
):
    """A `save_to_disk` folder is read as its files say: --format and --column-names were ignored without a word.
    Refused by train, and by evaluate when given; a run's config.yaml holding one still evaluates."""
    import datasets
    import pandas as pd
    import yaml

    folder = tmp_path / "saved"
    datasets.Dataset.from_pandas(pd.read_csv(sentiment_csv), preserve_index=False).save_to_disk(str(folder))
    capsys.readouterr()  # the saving bar
    at = base.index("--data") + 1
    on_folder = [*base[:at], str(folder), *base[at + 1 :]]
    code, _, err = run(capsys, *on_folder, "--format", "csv", "--max-steps", "1")
    _one_line_error(code, err, f"--format csv: {folder} is a folder, read as its files say", "leave --format out")
    code, _, err = run(capsys, *on_folder, "--column-names", "text,label", "--max-steps", "1")
    _one_line_error(code, err, "--column-names text,label:", "leave --column-names out")
    assert not (tmp_path / "run").exists()
    assert run(capsys, *on_folder, "--max-steps", "1")[0] == 0
    saved = tmp_path / "run" / "config.yaml"
    saved.write_text(yaml.safe_dump({**yaml.safe_load(saved.read_text()), "format": "csv"}, sort_keys=False))
    code, out, err = run(capsys, "evaluate", str(tmp_path / "run"))  # its held-out 10%
    assert code == 0 and json.loads(out)["examples"] == 24, err
    code, _, err = run(capsys, "evaluate", str(tmp_path / "run"), "--data", str(folder), "--format", "csv")
    _one_line_error(code, err, f"--format csv: {folder} is a folder", "leave --format out")


def test_train_help_names_every_task_and_shows_no_unset_defaults(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "sequence classifier" not in text and "causal language models" in text and "images, audio" in text
    assert "(default: None)" not in text
    assert "(default: 128)" in text and "(default: False)" in text  # real defaults are still shown


#: flags of other tasks than text classification's, each with the tasks that read it
OTHER_TASKS_FLAGS = [
    *("--reward", "exact-match", "--beta", "0.3", "--source-prefix", "x: ", "--tag-column", "3"),
    *("--num-generations", "4"),
]


def test_flags_only_other_tasks_read_are_refused_in_one_line_naming_each(capsys, base):
    """A text classifier given GRPO's, DPO's, seq2seq's and token classification's flags does not train as if
    they were not there: one line names each with the tasks that read it; a flag it reads is not named."""
    code, out, err = run(capsys, *base, *OTHER_TASKS_FLAGS, "--label-smoothing", "0.1", "--print-config")
    _one_line_error(
        code, err, "the text-classification task does not read", "--reward, --num-generations (grpo)",
        "--source-prefix (seq2seq)", "--tag-column (token-classification)", "--beta (dpo, kto)", "leave them out",
    )  # fmt: skip
    assert "--label-smoothing" not in err and "--max-length" not in err and not out


def test_a_config_files_keys_only_other_tasks_read_are_refused_and_its_defaults_are_not(capsys, base, tmp_path):
    """A key is a flag: one that only another task reads is refused from the file too; a value left at its default
    (`stride: 32`, token classification's) is never named, and a flag the task reads passes."""
    config = tmp_path / "shared.yaml"
    config.write_text("source_prefix: 'summarize: '\nstride: 32\nlabel_smoothing: 0.1\nmax_length: 64\n")
    code, _, err = run(capsys, *base, "--config", str(config), "--print-config")
    _one_line_error(code, err, "the text-classification task does not read --source-prefix (seq2seq); leave it out")
    config.write_text("stride: 32\nlabel_smoothing: 0.1\nmax_length: 64\n")
    code, out, err = run(capsys, *base, "--config", str(config), "--class-weights", "auto", "--print-config")
    assert code == 0 and "label_smoothing: 0.1" in out, err


def test_eval_fraction_given_with_eval_data_is_refused_and_a_config_recording_both_is_not(capsys, base, tmp_path):
    """--eval-fraction means nothing beside --eval-data, and its default would hide that it was given: the flag given
    is refused, whichever source sets --eval-data; a config.yaml, which records both, still reads."""
    data = base[base.index("--data") + 1]
    config = tmp_path / "config.yaml"
    config.write_text(f"eval_data: {data}\neval_fraction: 0.1\n")
    code, out, err = run(capsys, *base, "--config", str(config), "--print-config")
    assert code == 0 and f"eval_data: {data}" in out, err
    code, _, err = run(capsys, *base, "--config", str(config), "--eval-fraction", "0.3", "--print-config")
    _one_line_error(code, err, "--eval-fraction 0.3", "--eval-data", "leave --eval-fraction out")
    config.write_text(f"eval_data: {data}\neval_fraction: 0.2\n")  # a share set by hand, which nothing would read
    code, _, err = run(capsys, *base, "--config", str(config), "--print-config")
    _one_line_error(code, err, f"{config}: eval_fraction 0.2", "eval_data gives", "remove eval_fraction")
    config.write_text(f"data:\n  - {{path: {data}, eval_data: {data}, eval_fraction: 0.1}}\n")  # a source's own
    code, _, err = run(capsys, *[a for a in base if a not in ("--data", data)], "--config", str(config))
    _one_line_error(code, err, f"{data}: eval_fraction holds out a share of this source", "remove one")


def _saved_classifier(tiny_model_dir, folder, labels) -> dict:
    """The tiny BERT fine-tuned, as far as its files go: a trained head for `labels` (random weights) saved with
    the tokenizer; returns its state dict."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    config = BertConfig.from_pretrained(tiny_model_dir, id2label=dict(enumerate(labels)))
    torch.manual_seed(7)
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _published(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


#: a step that moves no weight (by more than 1e-20): what is published is what training started from
NO_STEP = ["--max-steps", "1", "--optimizer", "sgd", "--lr", "1e-30", "--weight-decay", "0", "--warmup-ratio", "0"]


def test_a_classifier_for_other_labels_trains_with_its_body_and_a_new_head(capsys, base, tiny_model_dir, tmp_path):
    import torch

    saved = _saved_classifier(tiny_model_dir, tmp_path / "sentiment3", ["neg", "neu", "pos"])
    argv = list(base)
    argv[argv.index("--model") + 1] = str(tmp_path / "sentiment3")
    code, _, err = run(capsys, *argv, *NO_STEP)  # the data's labels: neg, pos
    assert code == 0, err
    assert "the model's head (3 labels: neg, neu, pos) is replaced by a new one for this data's 2 labels" in err
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    published = _published(tmp_path / "run")
    assert published["classifier.weight"].shape == (2, 64)
    for key, value in saved.items():  # the body as saved, every tensor
        if key.startswith("bert."):
            torch.testing.assert_close(published[key], value, rtol=0, atol=1e-20, msg=key)


@pytest.mark.parametrize("order", [["neg", "pos"], ["pos", "neg"]])
def test_a_classifier_for_the_same_labels_keeps_its_trained_head(capsys, base, tiny_model_dir, tmp_path, order):
    """The same labels in another order: the head's rows are put in the data's order, and the user told."""
    import torch

    saved = _saved_classifier(tiny_model_dir, tmp_path / "sentiment2", order)
    argv = list(base)
    argv[argv.index("--model") + 1] = str(tmp_path / "sentiment2")
    code, _, err = run(capsys, *argv, *NO_STEP)
    assert code == 0, err
    assert "replaced by a new one" not in err
    reordered = "the model's head (2 labels: pos, neg) is kept, its outputs reordered to this data's label order"
    assert (reordered in err) == (order != ["neg", "pos"])
    published, rows = _published(tmp_path / "run"), [order.index(name) for name in ("neg", "pos")]
    for key in ("classifier.weight", "classifier.bias", "bert.pooler.dense.weight"):
        want = saved[key][rows] if key.startswith("classifier") else saved[key]
        torch.testing.assert_close(published[key], want, rtol=0, atol=1e-20, msg=key)


def test_predictions_written_as_csv_hold_lists_and_entities_as_json(tmp_path):
    """A token classifier's words, tags and entities (and a chat's messages) go into CSV cells as JSON, which
    leantrain and any JSON reader read back, not as Python's repr."""
    import pandas as pd

    from leantrain.inference import write_predictions

    entity = {"entity_group": "PER", "score": 0.9, "word": "Anna's", "start": 0, "end": 6}
    row = {"tokens": ["Anna's", "cat"], "entities": [entity], "tags": ["B-PER", "O"]}
    for suffix, sep in ((".csv", ","), (".tsv", "\t")):
        write_predictions([row], str(tmp_path / f"p{suffix}"), None)
        back = pd.read_csv(tmp_path / f"p{suffix}", sep=sep).iloc[0]
        assert {k: json.loads(back[k]) for k in row} == row
    write_predictions([{"text": "hi", "labels": ["a", "b"]}], str(tmp_path / "m.csv"), None)
    assert pd.read_csv(tmp_path / "m.csv").iloc[0]["labels"] == "a|b"  # multi-label: joined, as before


def test_a_grpo_run_given_trls_beta_is_told_it_is_kl_beta():
    """TRL's GRPOConfig calls the KL penalty's weight `beta`; leantrain's --beta is DPO's and KTO's."""
    from leantrain.config.sections import unread_message, unread_settings

    unread = unread_settings(TrainConfig(task="grpo", reward="exact-match", beta=0.04), "grpo")
    assert unread_message("grpo", unread) == (
        "the grpo task does not read --beta (dpo, kto); leave it out (or choose their task with --task); grpo's "
        "--kl-beta is what TRL's grpo trainer calls beta"
    )
