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


def test_the_default_job_trains_as_many_of_its_rows_as_fit_its_time():
    from leantrain.config.sections import DEFAULT_JOB_LR, DEFAULT_JOB_ROWS, DEFAULT_JOB_SECONDS

    job = TrainConfig(precision="fp32").resolved()
    assert (job.limit, job.max_time, job.max_time_seconds) == (DEFAULT_JOB_ROWS, "260s", 260.0)
    assert DEFAULT_JOB_SECONDS == 260 and DEFAULT_JOB_ROWS == 24_000
    assert TrainConfig(max_time="10m").resolved().max_time_seconds == 600  # your time, its rows
    counted = TrainConfig(max_steps=30).resolved()  # a step count given: no time
    assert (counted.limit, counted.max_time) == (DEFAULT_JOB_ROWS, None)
    rows = TrainConfig(limit=500).resolved()  # rows given: all of them, whatever the time
    assert (rows.limit, rows.max_time) == (500, None)
    mine = TrainConfig(data="mine.csv").resolved()  # your own data: every row, no time
    assert (mine.limit, mine.max_time) == (None, None)
    assert TrainConfig(limit=500).resolved().lr == DEFAULT_JOB_LR  # the default job's own rate
    assert TrainConfig(lr=3e-5, limit=9).resolved().lr == 3e-5 and TrainConfig(data="mine.csv").resolved().lr == 5e-5
    # the default job's own batch where --batch-size is left out; the usual one for your data; one given is kept
    assert TrainConfig(limit=9).resolved().batch_size == 16 and TrainConfig(data="mine.csv").resolved().batch_size == 32
    assert TrainConfig(limit=9, batch_size=32).resolved().batch_size == 32
    # a rate given is kept, the usual one included: it is not taken for a rate left out
    assert TrainConfig(lr=5e-5, limit=9).resolved().lr == 5e-5
    assert config_from_args(build_parser().parse_args(["train", "--lr", "5e-5", "--limit", "9"])).resolved().lr == 5e-5


@pytest.mark.parametrize(("given", "seconds"), [("260", 260), ("260s", 260), ("4.5m", 270), ("1h", 3600), (90, 90)])
def test_max_time_reads_seconds_minutes_and_hours(given, seconds):
    assert TrainConfig(data="mine.csv", max_time=given).max_time_seconds == seconds


@pytest.mark.parametrize("given", ["five minutes", "0", "-3s", "3 days"])
def test_a_time_that_cannot_be_read_is_refused_in_one_line(given, capsys):
    from leantrain.commands import cli

    assert cli.main(["train", "--data", "mine.csv", "--max-time", given, "--print-config"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "--max-time" in said[0] and "Traceback" not in said[0], said


def test_the_default_job_says_its_time_and_the_rows_that_reach_the_accuracy(capsys):
    from leantrain.commands import cli

    def line(*args: str) -> str:
        assert cli.main(["train", "--print-config", "--precision", "fp32", *args]) == 0
        said = capsys.readouterr()
        return next(x for x in (said.out + said.err).splitlines() if "the default job" in x)

    timed = line()
    assert "as many of 24,000 rows" in timed and "in 260 s (--max-time" in timed, timed
    assert "16,000 rows reach accuracy 0.80, 8,000 0.79" in timed, timed
    assert "as many" not in line("--max-steps", "40") and "24,000 rows" in line("--max-steps", "40")


def test_a_default_job_too_short_for_the_accuracy_is_told_what_to_expect():
    """Fewer rows than reach accuracy 0.80 in the job's time: its sizing says the accuracy they reach and what the
    rows that reach 0.80 would take on this machine; rows enough, or another run, hear nothing of it."""
    from leantrain.config.sections import default_job_expectation

    job = TrainConfig(precision="fp32").resolved()
    slow = default_job_expectation(job, 8_000, 32.0)  # an AVX2 EPYC's: 8,000 rows
    assert "expect about 0.785" in slow and "--limit 16000: about 8 minutes" in slow, slow
    assert "expect about 0.798" in default_job_expectation(job, 12_000, 50.0)  # not rounded to 0.80
    assert "expect about 0.795" in default_job_expectation(job, 11_000, 46.0)  # between the table's rows
    assert default_job_expectation(job, 13_000, 54.0) == ""  # 0.801
    assert "expect under 0.79" in default_job_expectation(job, 5_000, 20.0)
    assert default_job_expectation(job, 16_000, 64.0) == ""
    mine = TrainConfig(data="mine.csv", max_time="5m").resolved()
    assert default_job_expectation(mine, 8_000, 32.0) == ""


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
