import pytest

from leantrain.commands.cli import build_parser, config_from_args
from leantrain.config import TrainConfig, refuse_unswitched, without_unswitched
from leantrain.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_a_dict():
    cfg = TrainConfig()
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "key,value,flag",
    [
        ("batch_size", 0, "--batch-size"),
        ("max_length", -3, "--max-length"),
        ("limit", 0, "--limit"),
        ("max_steps", -1, "--max-steps"),
        ("eval_fraction", 1.0, "--eval-fraction"),
        ("eval_fraction", 0, "--eval-fraction"),
        ("epochs", 0, "--epochs"),
        ("lr", 0, "--lr"),
        ("warmup_ratio", 1.5, "--warmup-ratio"),
        ("scheduler", "exponential", "--scheduler"),
        ("precision", "int4", "--precision"),
        ("batch_size", 2.5, "--batch-size"),
        ("batch_size", "32", "--batch-size"),
        ("overwrite", "yes", "--overwrite"),
        ("seed", -1, "--seed must be a whole number from 0 to 4,294,967,293, got -1"),  # NumPy's seeds: a traceback
        ("seed", 2**32 - 2, "--seed"),  # the splits seed NumPy with seed + 2 too
        ("resume", " ", "--resume is empty"),  # it was read as the current folder
    ],
)
def test_bad_values_name_the_flag(key, value, flag):
    with pytest.raises(ConfigError, match=flag):
        TrainConfig(**{key: value})


@pytest.mark.parametrize("model", ["preset:tiny-vit", "scratch/config.json"])
def test_an_adapter_alone_of_a_model_built_from_scratch_is_refused(model):
    """--save-adapter writes the adapter without its base: a base built from scratch (a preset, a bare config) is
    saved nowhere else, so the adapter could never be loaded."""
    with pytest.raises(ConfigError, match=rf"--save-adapter: {model} is built from scratch"):
        TrainConfig(model=model, lora=True, save_adapter=True)
    TrainConfig(model=model, lora=True)  # the merged model is written: fine
    TrainConfig(model="some/folder", lora=True, save_adapter=True)  # a pretrained base: fine


def test_a_sources_own_bad_setting_is_refused_naming_the_source():
    """Checked with the run's settings, before any data is read (it was refused after reading, naming no source)."""
    with pytest.raises(ConfigError, match=r"^--data source a \(a.csv\): --eval-fraction must be between 0 and 1"):
        TrainConfig(data=[{"path": "a.csv", "eval_fraction": 0}, "b.csv"])
    TrainConfig(data=[{"path": "a.csv", "eval_fraction": 0.2}, "b.csv"])


def test_yaml_values_are_overridden_by_flags(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("batch_size: 8\nlr: 1e-4\nmax-length: 64\n")
    cfg = TrainConfig.from_yaml(path, overrides={"batch_size": 16})
    assert (cfg.batch_size, cfg.lr, cfg.max_length) == (16, 1e-4, 64)


def test_unknown_yaml_key_is_refused_with_a_suggestion(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r"job.yaml: unknown key 'batch_sise'; did you mean 'batch_size'"):
        TrainConfig.from_yaml(path)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        TrainConfig.from_yaml(path)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="--config: no such file"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The default job's speed measurement replaced by a figure the test sets (`measured.speed`), counted."""
    from leantrain import parallel
    from leantrain.model import training_speed
    from leantrain.parallel import threads

    class Measured:
        speed, calls, others, within = 100.0, [], 0.0, []

    def fake(model_path, precision, batch, length, steps=3, fast=True, freeze="none", dropout=None, within=None):
        extra = ((freeze,) if freeze != "none" else ()) + ((dropout,) if dropout is not None else ())
        Measured.calls.append((precision, batch, length, *extra))
        Measured.within.append(within)
        return Measured.speed

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(training_speed, "_MEASURED", {})
    monkeypatch.setattr(training_speed, "measure_training_speed", fake)
    monkeypatch.setattr(threads, "neighbour_load", lambda: lambda: Measured.others)  # a quiet machine unless set
    monkeypatch.setattr(parallel, "device_type", lambda: "cpu")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return Measured


def test_the_default_job_trains_what_this_machine_trains_in_about_four_minutes(measured):
    from leantrain.config.sections import DEFAULT_JOB_LENGTH, DEFAULT_JOB_LR, DEFAULT_JOB_ROWS, DEFAULT_JOB_SECONDS

    measured.speed = 50.9  # 250 s at 50.9 samples/s: 12,725 training rows, rounded down to a thousand
    assert TrainConfig(precision="fp32").resolved().limit == 12_000
    # measured as the job runs: its own batch, its embeddings frozen
    assert measured.calls == [("fp32", 16, DEFAULT_JOB_LENGTH, "embeddings", 0.0)] and DEFAULT_JOB_SECONDS == 250
    measured.speed = 80.0
    assert TrainConfig(precision="fp32").resolved().limit == 12_000  # the same shape: the speed measured before
    assert TrainConfig(precision="bf16", batch_size=8).resolved().limit == 20_000  # measured for its own shape
    assert measured.calls[-1] == ("bf16", 8, DEFAULT_JOB_LENGTH, "embeddings", 0.0)
    measured.speed = 1000.0
    assert TrainConfig(precision="fp16").resolved().limit == DEFAULT_JOB_ROWS["max"]
    measured.speed = 0.5
    assert TrainConfig(precision="fp16", batch_size=4).resolved().limit == DEFAULT_JOB_ROWS["min"]
    calls = len(measured.calls)
    assert TrainConfig(limit=500).resolved().limit == 500
    assert TrainConfig(data="mine.csv").resolved().limit is None  # your own data: every row
    assert len(measured.calls) == calls  # neither measures
    assert TrainConfig(limit=500).resolved().lr == DEFAULT_JOB_LR  # the default job's own rate
    assert TrainConfig(lr=3e-5, limit=9).resolved().lr == 3e-5 and TrainConfig(data="mine.csv").resolved().lr == 5e-5
    # the default job's own batch where --batch-size is left out; the usual one for your data; one given is kept
    assert TrainConfig(limit=9).resolved().batch_size == 16 and TrainConfig(data="mine.csv").resolved().batch_size == 32
    assert TrainConfig(limit=9, batch_size=32).resolved().batch_size == 32
    # a rate given is kept, the usual one included: it is not taken for a rate left out
    assert TrainConfig(lr=5e-5, limit=9).resolved().lr == 5e-5
    assert config_from_args(build_parser().parse_args(["train", "--lr", "5e-5", "--limit", "9"])).resolved().lr == 5e-5


def test_the_default_jobs_speed_is_measured_on_the_step_its_classifier_takes(measured, tiny_model_dir):
    import torch
    import transformers

    from leantrain.tasks.classification import cut_at_the_first_token

    TrainConfig(precision="fp32").resolved()
    assert measured.within == [cut_at_the_first_token]  # the last layer at the first token, as the task trains
    TrainConfig(precision="bf16", compile=True).resolved()
    TrainConfig(precision="fp16", activation_checkpointing=True).resolved()
    assert measured.within[1:] == [None, None]  # neither cuts: the task runs the whole last layer (`check_model`)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    ids = torch.tensor([[2, 5, 7, 9]])
    whole = model(input_ids=ids).logits
    rows = []
    model.bert.encoder.layer[-1].register_forward_hook(
        lambda _m, _a, out: rows.append((out[0] if isinstance(out, tuple) else out).shape[1])
    )
    with cut_at_the_first_token(model)():
        torch.testing.assert_close(model(input_ids=ids).logits, whole)
    assert rows[-1] == 1  # the last layer's output: the first token's row alone
    assert cut_at_the_first_token(torch.nn.Linear(2, 2)) is None  # no BERT-shaped layer: the whole step


def test_the_default_jobs_measured_speed_is_kept_so_the_job_stays_the_same(measured):
    from leantrain.model import training_speed

    measured.speed = 50.0
    assert TrainConfig(precision="fp32").resolved().limit == 12_000
    training_speed._MEASURED.clear()  # a later process: only the file remembers
    measured.speed = 80.0
    assert TrainConfig(precision="fp32").resolved().limit == 12_000
    assert len(measured.calls) == 1
    training_speed.cache_file().unlink()  # deleted: measured again
    assert TrainConfig(precision="fp32").resolved().limit == 20_000
    training_speed.cache_file().unlink()  # a cache that cannot be written: measured once in this process all the same
    training_speed.cache_file().mkdir()
    training_speed._MEASURED.clear()
    measured.speed = 20.0
    assert [TrainConfig(precision="fp32").resolved().limit for _ in range(2)] == [5_000, 5_000]
    assert len(measured.calls) == 3


def test_a_speed_measured_beside_a_busy_neighbour_sizes_this_run_only(measured):
    """Other processes held a core while the speed was measured: this run is sized from it (the neighbour slows it
    too), but it is not kept, so that a busy first run does not shrink every later default job on the machine."""
    from leantrain.config.sections import default_job_rows
    from leantrain.model import training_speed

    measured.speed, measured.others = 20.0, 1.2
    for _ in range(2):  # the job asks twice (resolving, then its line): the second answer comes from this process
        rows, why = default_job_rows(TrainConfig(precision="fp32"))
        assert rows == 5_000 and "other processes used 1.2 cores: not kept" in why, why
    assert len(measured.calls) == 1
    assert not training_speed.cache_file().exists()
    training_speed._MEASURED.clear()  # a later process, on a quiet machine: measured again, and kept
    measured.speed, measured.others = 50.0, 0.1
    assert TrainConfig(precision="fp32").resolved().limit == 12_000
    training_speed._MEASURED.clear()
    assert TrainConfig(precision="fp32").resolved().limit == 12_000 and len(measured.calls) == 2


def test_the_default_job_is_not_measured_where_the_measurement_would_not_fit(measured, monkeypatch):
    from leantrain import parallel
    from leantrain.config.sections import DEFAULT_JOB_LIMIT

    assert TrainConfig(model="bert-base-uncased").resolved().limit == DEFAULT_JOB_LIMIT  # not the measured model
    assert TrainConfig(task="causal-lm").resolved().limit == DEFAULT_JOB_LIMIT
    assert TrainConfig(num_machines=2).resolved().limit == DEFAULT_JOB_LIMIT  # each machine would measure its own
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert TrainConfig().resolved().limit == DEFAULT_JOB_LIMIT
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(parallel, "device_type", lambda: "cuda")
    assert TrainConfig().resolved().limit == DEFAULT_JOB_LIMIT
    assert measured.calls == []


def test_the_default_job_says_the_speed_it_measured_and_the_time_that_buys(measured, capsys):
    from leantrain.commands import cli

    measured.speed = 50.0
    assert cli.main(["train", "--print-config", "--precision", "fp32"]) == 0
    said = capsys.readouterr()
    line = next(x for x in (said.out + said.err).splitlines() if "the default job" in x)
    assert "12,000 rows" in line and "50 samples/s in fp32" in line and "about 240 s of training" in line, line


def test_a_machine_too_slow_for_the_accuracy_is_told_what_to_expect(measured, capsys):
    """Fewer rows than reach accuracy 0.80 in the job's time: the line says the accuracy they reach and what the
    rows that reach 0.80 would take on this machine; a machine fast enough hears nothing of it."""
    from leantrain.commands import cli

    def line() -> str:
        assert cli.main(["train", "--print-config", "--precision", "fp32"]) == 0
        said = capsys.readouterr()
        return next(x for x in (said.out + said.err).splitlines() if "the default job" in x)

    measured.speed = 32.0  # an AVX2 EPYC's: 8,000 rows
    slow = line()
    assert "8,000 rows" in slow and "expect about 0.790" in slow and "--limit 16000: about 8 minutes" in slow, slow
    training_speed_cache_cleared()
    measured.speed = 54.0  # 13,000 rows: 0.796 by the table, which would round to 0.80
    assert "13,000 rows" in (near := line()) and "expect about 0.796" in near, near
    training_speed_cache_cleared()
    measured.speed = 46.0  # 11,000 rows: between the table's rows
    assert "11,000 rows" in (near := line()) and "expect about 0.794" in near, near
    training_speed_cache_cleared()
    measured.speed = 100.0
    fast = line()
    assert "24,000 rows" in fast and "expect" not in fast, fast


def training_speed_cache_cleared() -> None:
    from leantrain.model import training_speed

    training_speed._MEASURED.clear()
    training_speed.cache_file().unlink()


def test_settings_only_other_tasks_read_are_found_for_built_in_tasks_only():
    """`unread_settings` names the fields given away from their default that the task does not read; a task no
    field names (one of your own) may read any, so none are named for it."""
    from leantrain.config.sections import unread_settings

    cfg = TrainConfig(beta=0.3, tag_column=3, stride=32, label_smoothing=0.1)
    assert unread_settings(cfg, "text-classification") == {
        "tag_column": ("token-classification",),
        "beta": ("dpo", "kto"),
    }
    assert unread_settings(cfg, "token-classification") == {"beta": ("dpo", "kto")}
    assert unread_settings(cfg, "word-count") == {}


def test_a_runs_own_config_is_read_back_for_inference_whatever_it_carries(tmp_path, tiny_model_dir):
    """A run trained before such settings were refused may have recorded one: scoring its model still works."""
    import json
    import shutil

    import yaml

    from leantrain.job import for_inference

    model = tmp_path / "run" / "model"
    shutil.copytree(tiny_model_dir, model)
    (model.parent / "config.yaml").write_text(yaml.safe_dump({"task": "text-classification", "tag_column": 3}))
    (model.parent / "metrics.json").write_text(json.dumps({}))
    job = for_inference(str(model), {})
    assert job.task.name == "text-classification" and job.cfg.tag_column == 3


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (dict(early_stopping_threshold=0.5), "--early-stopping-threshold needs --early-stopping-patience"),
        (dict(streaming_eval_rows=10), "--streaming-eval-rows needs --streaming"),
        (dict(eval_split="test"), "--eval-split needs --eval-data"),  # the held-out rows were scored instead
    ],
)
def test_a_setting_without_its_switch_is_refused_not_ignored(given, said):
    """`--streaming-eval-rows 10` without `--streaming` was ignored: refused, naming the switch."""
    with pytest.raises(ConfigError, match=said):
        TrainConfig(data="x.csv", **given)
    if "streaming_eval_rows" in given:  # with its switch it stands
        assert TrainConfig(data="x.csv", streaming=True, max_steps=2, **given).streaming_eval_rows == 10
    if "eval_split" in given:  # beside --eval-data, or a source's own eval_data
        assert TrainConfig(data="glue:sst2", eval_data="glue:sst2", **given).eval_split == "test"
        sources = [{"path": "a.csv", "eval_data": "glue:sst2"}, {"path": "b.csv", "eval_data": "glue:sst2"}]
        assert TrainConfig(data=sources, **given).eval_split == "test"


def test_a_run_wide_eval_split_beside_a_mixture_source_without_eval_data_names_that_source():
    """The source holds its rows out, so the split is not read for it: refused naming it (the run stopped later
    with "--eval-split needs --eval-data", naming no source), and how to give the split to the others."""
    sources = [{"path": "a.csv", "eval_data": "glue:sst2"}, "b.csv"]
    said = r"^--data source b \(b.csv\): --eval-split test needs its eval_data, and it has none .*in the mapping of"
    with pytest.raises(ConfigError, match=said):
        TrainConfig(data=sources, eval_split="test")
    own = [{"path": "a.csv", "eval_data": "glue:sst2", "eval_split": "test"}, "b.csv"]
    assert TrainConfig(data=own).data == own  # the source's own split, read by it alone


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (dict(lora_r=4, lora_targets="nosuch"), "--lora-r, --lora-targets need --lora"),
        (dict(muon_lr=0.01), "--muon-lr needs --optimizer muon"),
        (dict(projection_rank=4), "--projection-rank needs --optimizer galore-adamw or apollo-adamw"),
        (dict(optimizer="muon", projection_scale=0.5), "--projection-scale needs --optimizer galore-adamw or apollo"),
    ],
)
def test_a_run_refuses_lora_and_optimizer_settings_without_their_switch(given, said):
    """`--lora-r 4` without `--lora` trained the whole model, the rank ignored: a run refuses it, naming the switch.
    A config holds them (`bench` and `plan` carry one job's settings across candidates that differ in the switch)."""
    cfg = TrainConfig(data="x.csv", **given)
    with pytest.raises(ConfigError, match=said):
        refuse_unswitched(cfg)
    switched = (
        dict(lora=True) if "lora_r" in given else dict(optimizer="muon" if "muon_lr" in given else "galore-adamw")
    )
    refuse_unswitched(TrainConfig(data="x.csv", **{**given, **switched}))  # with its switch it stands


def test_the_python_api_refuses_them_too():
    from leantrain import train

    with pytest.raises(ConfigError, match="--lora-r needs --lora"):
        train(TrainConfig(data="x.csv", lora_r=4))


def test_a_bench_candidate_keeps_only_the_settings_its_switches_read():
    job = dict(data="x.csv", lora_r=4, muon_lr=0.01, projection_rank=8, lr=1e-3)
    assert without_unswitched({**job, "optimizer": "muon"}) == {
        "data": "x.csv",
        "optimizer": "muon",
        "muon_lr": 0.01,
        "lr": 1e-3,
    }
    assert without_unswitched({**job, "lora": True, "optimizer": "apollo-adamw"}) == {
        "data": "x.csv", "lora": True, "optimizer": "apollo-adamw", "lora_r": 4, "projection_rank": 8, "lr": 1e-3,
    }  # fmt: skip
    assert without_unswitched(job) == {"data": "x.csv", "lr": 1e-3}
    # a run's config.yaml records --eval-fraction beside --eval-data: as flags the pair is refused, and unread
    recorded = {"data": "x.csv", "eval_data": "e.csv", "eval_fraction": 0.1}
    assert without_unswitched(recorded) == {"data": "x.csv", "eval_data": "e.csv"}
    assert without_unswitched({"data": "x.csv", "eval_fraction": 0.2}) == {"data": "x.csv", "eval_fraction": 0.2}


def test_comma_separated_settings_take_a_list_of_names_in_python():
    """As YAML lists and peft's target_modules: each setting of comma-separated names takes a list of them."""
    cfg = TrainConfig(
        metrics=["accuracy", "macro_f1"],
        freeze=("embeddings", "bert.encoder.layer.0.*"),
        column_names=["label", "text"],
        report_to=["tensorboard"],
        reward=["exact-match", "my_rewards:brevity=0.1"],
    )
    assert (cfg.metrics, cfg.freeze, cfg.column_names) == (
        "accuracy,macro_f1",
        "embeddings,bert.encoder.layer.0.*",
        "label,text",
    )
    assert (cfg.report_to, cfg.reward) == ("tensorboard", "exact-match,my_rewards:brevity=0.1")
    with pytest.raises(ConfigError, match=r"^--metrics must be a string or a list of strings, got \[1\]"):
        TrainConfig(metrics=[1])


@pytest.mark.parametrize(
    ("task", "given", "unread"),
    [
        ("seq2seq", dict(text_column="source", label_column="target"), {"text_column", "label_column"}),
        ("token-classification", dict(label_column="tags", text_pair_column="b"), {"label_column", "text_pair_column"}),
        ("token-classification", dict(text_column="text"), set()),  # span rows' texts
        ("image-classification", dict(label_column="category"), set()),
        ("causal-lm", dict(text_column="body", text_pair_column="b"), {"text_pair_column"}),
    ],
)
def test_the_text_pair_and_label_columns_are_refused_by_tasks_that_read_none(task, given, unread):
    """seq2seq reads --source-column and --target-column: `--text-column source --label-column target` trained on
    the columns it guessed without a word, as token classification ignored --label-column."""
    from leantrain.config.sections import unread_settings

    assert set(unread_settings(TrainConfig(data="x.csv", **given), task)) == unread
