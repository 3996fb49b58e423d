"""TrainingArguments names (issue #17): one alias table for flags and YAML, both spellings, one-line refusals, the
"did you mean" hint, every get_scheduler schedule, the warm-up as steps or a ratio, --ray-workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from leantrain.commands import cli
from leantrain.config import SCHEDULERS, TrainConfig
from leantrain.errors import ConfigError


def flags_config(*argv: str) -> TrainConfig:
    args = cli.build_parser().parse_args(cli._dashed(["train", *argv]))
    return cli.config_from_args(args)


def refused(capsys, *argv: str) -> str:
    # a model that does not exist: should the flags pass by mistake, the run fails at once instead of training
    assert cli.main(["train", "--model", "/no/such/model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def refused_alone(values: dict, task: str | None = None) -> set[str]:
    """The names of `values` that a config of that one name (with the task) refuses."""
    refused = set()
    for name, value in values.items():
        try:
            TrainConfig.from_dict({"task": task, name: value})
        except ConfigError:
            refused.add(name)
    return refused


def test_trainer_flag_names_set_the_leantrain_fields_in_either_spelling():
    cfg = flags_config(
        "--learning_rate", "2e-5",
        "--per-device-train-batch-size", "8",
        "--per_device_eval_batch_size", "64",
        "--num_train_epochs", "3",
        "--gradient_accumulation_steps", "4",
        "--eval_strategy", "epoch",
        "--save_steps", "50",
        "--logging-steps", "5",
        "--bf16",
        "--gradient_checkpointing", "true",
        "--warmup_steps", "0.1",
        "--lr_scheduler_type", "cosine",
        "--load_best_model_at_end",
        "--metric_for_best_model", "eval_loss",
        "--resume_from_checkpoint", "true",
        "--overwrite_output_dir",
        "--dataloader_num_workers", "2",
        "--optim", "adamw_torch_fused",
        "--max_steps", "-1",
        "--seed", "7",
        "--generation_max_length", "64",
    )  # fmt: skip
    assert (cfg.lr, cfg.batch_size, cfg.eval_batch_size, cfg.epochs, cfg.grad_accum) == (2e-5, 8, 64, 3.0, 4)
    assert (cfg.eval_every, cfg.save_every, cfg.log_every) == ("epoch", 50, 5)
    assert cfg.precision == "bf16" and cfg.activation_checkpointing is True
    assert (cfg.warmup_steps, cfg.scheduler) == (0.1, "cosine")
    assert cfg.load_best_at_end and cfg.metric_for_best == "eval_loss"
    assert cfg.resume == "auto" and cfg.overwrite and cfg.dataloader_num_workers == 2
    assert (cfg.optimizer, cfg.max_steps, cfg.seed) == ("adamw", None, 7)
    assert cfg.generation_max_new_tokens == 63  # the decoder's start token is counted in the Trainer's length


def test_leantrain_flags_take_underscores_too():
    assert flags_config("--batch_size", "4", "--max_length", "64").batch_size == 4


def test_epoch_is_a_step_count_for_evaluating_and_saving(capsys):
    cfg = flags_config("--eval-every", "epoch", "--save_every", "epoch")
    assert (cfg.eval_every, cfg.save_every) == ("epoch", "epoch")
    assert cli.main(["train", "--eval-every", "weekly"]) == 2
    assert "needs an integer or 'epoch', got 'weekly'" in capsys.readouterr().err
    relaunch = TrainConfig(eval_every="epoch").to_argv()  # what the launcher passes to the processes it starts
    assert relaunch == ["--eval-every", "epoch"] and flags_config(*relaunch).eval_every == "epoch"
    with pytest.raises(ConfigError, match="--save-every must be an integer or 'epoch', got 'weekly'"):
        TrainConfig(save_every="weekly")


def test_strategies_follow_training_arguments():
    assert flags_config("--eval_strategy", "steps", "--eval_steps", "20").eval_every == 20
    assert flags_config("--eval_strategy", "steps", "--logging_steps", "30").eval_every == 30  # eval_steps' default
    assert flags_config("--save_strategy", "epoch").save_every == "epoch"
    assert flags_config("--eval_strategy", "no").eval_every is None
    assert flags_config("--fp16", "false", "--bf16", "false").precision == "fp32"
    assert flags_config("--fp16", "1").precision == "fp16"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--lr", "1e-4", "--learning_rate", "2e-5"], "--lr and --learning-rate both set lr; give one"),
        (["--learning-rate", "1e-4", "--learning_rate", "2e-5"], None),  # argparse: the last one wins, one flag
        (["--eval-every", "5", "--eval_steps", "10"], "--eval-every and --eval-steps both set eval_every"),
        (["--precision", "fp16", "--bf16"], "--precision and --bf16 both set precision"),
        (["--bf16", "--fp16"], "bf16 and fp16 are both true"),
        (["--eval_strategy", "epoch", "--eval_steps", "10"], "--eval-steps needs eval_strategy steps, not epoch"),
        (["--num-workers", "4"], "--ray-workers N sets Ray Train workers"),
        (["--num_workers", "4"], "--dataloader-num-workers N data-loader worker processes"),
        (["--optim", "lion_8bit"], "optim 'lion_8bit' has no leantrain optimizer"),
        (["--save_strategy", "best"], "save_strategy best: use --load-best-at-end"),
        # TrainingArguments reads 0.1 as a tenth of the run: said, not just "needs an integer"
        (["--logging_steps", "0.1"], "--logging-steps: needs a whole number of optimizer steps (a fraction of the run"),
        (["--eval-every", "0.5"], "--eval-every: needs a whole number of optimizer steps (a fraction of the run"),
        # named as given, not as the --generation-max-new-tokens -1 it would translate to
        (["--generation_max_length", "1"], "generation_max_length must be an integer of 2 or more"),
        (["--generation-max-length", "2.5"], "generation_max_length must be an integer of 2 or more"),
    ],
)
def test_an_alias_with_its_own_flag_and_bad_values_are_one_line_errors(capsys, argv, says):
    if says is None:
        assert flags_config(*argv).lr == 2e-5
        return
    assert says in refused(capsys, *argv)


@pytest.mark.parametrize(
    "flag, hint",
    [
        ("--save-stesp", "did you mean --save-steps?"),  # never --max-steps
        ("--loging-steps", "did you mean --logging-steps?"),  # never --local-sgd-steps
        ("--learning-reta", "did you mean --learning-rate?"),
        ("--batchsize", "did you mean --batch-size?"),
        ("--frobnicate", "unknown flag --frobnicate; see `leantrain train --help`"),  # no flag like it (not --strict)
        ("--push_to_hub", "push_to_hub (TrainingArguments) has no leantrain setting: model/ is a save_pretrained"),
        ("--deepspeed", "has no leantrain setting: not supported: use --shard fsdp"),
    ],
)
def test_the_hint_consults_trainer_names_first(capsys, flag, hint):
    assert hint in refused(capsys, flag, "1")


def test_yaml_takes_trainer_names_and_flags_override_them(tmp_path):
    path = tmp_path / "hf.yaml"
    path.write_text("learning_rate: 3.0e-5\nper_device_train_batch_size: 16\neval_strategy: epoch\nbf16: true\n")
    cfg = TrainConfig.from_yaml(path)
    assert (cfg.lr, cfg.batch_size, cfg.eval_every, cfg.precision) == (3e-5, 16, "epoch", "bf16")
    assert TrainConfig.from_yaml(path, overrides={"lr": 1e-4}).lr == 1e-4  # a flag beats the file, silently
    path.write_text("learning_rate: 3.0e-5\nlr: 1.0e-4\n")
    with pytest.raises(ConfigError, match=r"hf.yaml: learning_rate and lr both set lr; give one"):
        TrainConfig.from_yaml(path)
    path.write_text("save_step: 10\n")  # YAML keys are never abbreviations
    with pytest.raises(ConfigError, match=r"unknown key 'save_step'; did you mean 'save_steps'\?"):
        TrainConfig.from_yaml(path)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_schedule_builds_and_steps(name):
    from leantrain.model.schedules import build_scheduler

    needs = {
        "cosine_with_min_lr": '{"min_lr_rate": 0.1}',
        "cosine_warmup_with_min_lr": '{"min_lr": 1e-6}',
        "warmup_stable_decay": '{"num_decay_steps": 3}',
    }
    cfg = TrainConfig(scheduler=name, scheduler_kwargs=needs.get(name))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, cfg.scheduler, 10, 0.2, None, cfg.scheduler_kwargs)
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(10):
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    assert lrs[0] < 1.0 and max(lrs[:3]) == pytest.approx(1.0)  # two warm-up steps reach the peak
    assert (lrs[-1] < 1.0) == (name not in ("constant", "constant_with_warmup"))  # then the schedule's own shape


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"scheduler": "cosine_with_min_lr"}, "--scheduler cosine_with_min_lr needs min_lr or min_lr_rate: add"),
        ({"scheduler": "warmup_stable_decay"}, "needs num_decay_steps"),
        ({"scheduler": "reduce_lr_on_plateau"}, "steps on an evaluation metric"),
        ({"scheduler_kwargs": "[1]"}, "--scheduler-kwargs must be a JSON object"),
        ({"warmup_steps": 2.5}, "--warmup-steps must be a whole number of steps or a ratio"),
    ],
)
def test_schedules_missing_their_arguments_are_refused(changes, says):
    with pytest.raises(ConfigError, match=says):
        TrainConfig(**changes)


def test_a_wrong_schedule_argument_is_one_line():
    from leantrain.model.schedules import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="--scheduler cosine --scheduler-kwargs"):
        build_scheduler(optimizer, "cosine", 10, 0.0, None, '{"num_decay_steps": 3}')


@pytest.mark.parametrize(
    "name, kwargs, says",
    [
        ("polynomial", '{"lr_end": -0.01}', "the learning rate at step 6 would be -0.002;"),  # trained on, silently
        ("polynomial", '{"power": -1}', "fails at step 10 (0.0 cannot be raised to a negative power)"),  # a traceback
        ("inverse_sqrt", '{"timescale": -3}', "fails at step 3 (float division by zero)"),  # after the run
    ],
)
def test_schedule_arguments_that_fail_or_go_negative_at_some_step_are_refused_before_training(name, kwargs, says):
    from leantrain.model.schedules import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    with pytest.raises(ConfigError) as err:
        build_scheduler(optimizer, name, 10, 0.0, None, kwargs)
    assert str(err.value).startswith(f"--scheduler {name} --scheduler-kwargs {kwargs}: {says}")
    build_scheduler(optimizer, name, 10, 0.0, None, '{"power": 2}' if name == "polynomial" else '{"timescale": 3}')


@pytest.mark.parametrize("warmup_steps, ramp", [(4, 4), (0.5, 5), (None, 1)])  # None: --warmup-ratio 0.1
def test_warmup_steps_are_steps_or_a_ratio_below_one(warmup_steps, ramp):
    from leantrain.model.schedules import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, "constant", 10, 0.1, warmup_steps)
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(6):
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    assert lrs[ramp] == 1.0 and lrs[ramp - 1] < 1.0


def test_ray_workers_is_the_new_name():
    assert TrainConfig(launcher="ray", ray_workers=2).ray_workers == 2
    with pytest.raises(ConfigError, match="--num-workers is gone"):
        TrainConfig.from_dict({"num_workers": 2})


def test_the_trainer_users_page_is_generated_from_the_table():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_trainer_docs.py"
    proc = subprocess.run([sys.executable, str(script), "--check"])
    assert proc.returncode == 0, "docs/for-trainer-users.md is stale: run python scripts/gen_trainer_docs.py"


def test_every_row_names_a_real_setting_and_reads_back():
    from dataclasses import fields

    from leantrain.config.hf_names import ROWS

    known = {f.name for f in fields(TrainConfig)}
    assert all(row.field in known for row in ROWS if row.field is not None)
    text = (Path(__file__).resolve().parents[1] / "docs" / "for-trainer-users.md").read_text()
    assert all(f"| `{row.hf}` |" in text for row in ROWS)


def test_greater_is_better_is_accepted_where_it_agrees_with_the_metric_and_refused_where_not(tmp_path, capsys):
    assert TrainConfig.from_dict({"metric_for_best_model": "accuracy", "greater_is_better": True}).metric_for_best == (
        "accuracy"
    )
    assert TrainConfig.from_dict({"metric_for_best_model": "eval_loss", "greater_is_better": False}).metric_for_best
    assert TrainConfig.from_dict({"greater_is_better": False}).metric_for_best == "loss"  # the Trainer's default pair
    with pytest.raises(ConfigError, match=r"greater_is_better false contradicts metric_for_best_model accuracy: for "):
        TrainConfig.from_dict({"metric_for_best_model": "accuracy", "greater_is_better": False})
    err = refused(capsys, "--metric-for-best", "loss", "--greater-is-better", "true")
    assert "--greater-is-better true contradicts --metric-for-best loss: for loss, lower is better" in err


def test_logging_strategy_steps_is_what_leantrain_does_and_the_others_are_refused(tmp_path):
    assert TrainConfig.from_dict({"logging_strategy": "steps", "logging_steps": 7}).log_every == 7
    with pytest.raises(ConfigError, match=r"--log-every must be an integer \(a number of optimizer steps: a fraction"):
        TrainConfig.from_dict({"logging_steps": 0.1})
    with pytest.raises(ConfigError, match=r"logging_strategy epoch: leantrain logs a metrics.jsonl row every"):
        TrainConfig.from_dict({"logging_strategy": "epoch"})


def test_every_refused_name_is_named_at_once(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("deepspeed: ds.json\nlearning_rate: 1e-4\nadam_beta1: 0.8\nnum_epoch: 2\npush_to_hub: true\n")
    with pytest.raises(ConfigError) as refusal:
        TrainConfig.from_yaml(path)
    message = str(refusal.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{path}: 4 names refused: ")
    for name in ("deepspeed (TrainingArguments)", "adam_beta1", "unknown key 'num_epoch'", "push_to_hub"):
        assert name in message, name


def test_group_by_length_is_its_batch_order_and_false_is_refused(capsys):
    assert flags_config().batch_order == "shuffled"
    assert flags_config("--group_by_length").batch_order == "longest-first"
    assert TrainConfig.from_dict({"train_sampling_strategy": "group_by_length"}).batch_order == "longest-first"
    assert "group_by_length false: leantrain always groups batches by length" in refused(
        capsys, "--group-by-length", "false"
    )
    with pytest.raises(ConfigError, match=r"train_sampling_strategy random: leantrain always groups"):
        TrainConfig.from_dict({"train_sampling_strategy": "random"})
    assert "--batch-order must be one of shuffled, longest-first; got 'random'" in refused(
        capsys, "--batch-order", "random"
    )


#: the Trainer's defaults that leantrain refuses, because it does otherwise: batches grouped by length, and a
#: seq2seq evaluation that generates
REFUSED_DEFAULTS = {"train_sampling_strategy", "sortish_sampler", "predict_with_generate"}


def test_every_training_arguments_field_has_a_row_and_its_default_is_accepted_where_leantrain_agrees():
    """Every field of the installed transformers' Seq2SeqTrainingArguments is in the table: translated, accepted
    where its value says what leantrain does, or refused with the reason (a field a new transformers adds fails here
    until it has its row). Each default alone, and all of them in one file as `TrainingArguments().to_dict()` writes
    them, train as leantrain's own defaults would, except the few where leantrain does otherwise."""
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    from leantrain.config.hf_names import BY_NAME

    fields = dataclasses.fields(Seq2SeqTrainingArguments)
    assert sorted(f.name for f in fields if f.name not in BY_NAME) == []
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    refused = refused_alone(defaults)
    assert refused == REFUSED_DEFAULTS
    dump = TrainConfig.from_dict({k: v for k, v in defaults.items() if k not in REFUSED_DEFAULTS})
    # what the Trainer's defaults say: lr 5e-5, bf16 and fp16 false (full precision), a checkpoint every 500 steps
    assert (dump.lr, dump.precision, dump.save_every, dump.eval_every) == (5e-5, "fp32", 500, None)


@pytest.mark.parametrize(
    "argv",
    [
        ["--adam_beta1", "0.9", "--adam-epsilon", "1e-8"],
        ["--ddp_find_unused_parameters", "false", "--dataloader_drop_last", "false"],
        ["--gradient_checkpointing_kwargs", '{"use_reentrant": false}', "--torch_compile_backend", "inductor"],
        ["--do_train", "--do_eval", "false", "--log_on_each_node", "true", "--include_num_input_tokens_seen", "no"],
    ],
)
def test_names_whose_values_say_what_leantrain_does_are_accepted_as_flags(argv):
    assert flags_config(*argv) == flags_config()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--adam_beta1", "0.8"], "adam_beta1 (TrainingArguments) has no leantrain setting: AdamW keeps torch's "),
        (["--adam_beta1", "0.8"], "(accepted: 0.9)"),
        (["--logging_first_step"], "metrics.jsonl rows come every --log-every optimizer steps and at the last"),
        (["--gradient_checkpointing_kwargs", '{"use_reentrant": true}'], 'accepted: null or {} or {"use_reentrant"'),
        (["--tf32", "true"], "fp32 matrix products stay full fp32 on a GPU"),
        (["--torch_compile_mode", "max-autotune"], "--compile picks the mode: reduce-overhead (CUDA graphs) on a GPU"),
        (["--hub_model_id", "me/model"], "see push_to_hub (model/ is a save_pretrained folder with a model card"),
    ],
)
def test_other_values_of_those_names_are_refused_with_what_leantrain_does(capsys, argv, says):
    assert says in refused(capsys, *argv)


def test_trainer_names_for_leantrain_settings_set_them(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "use_liger_kernel: true\nenable_jit_checkpoint: true\nddp_timeout: 600\n"
        "gradient_checkpointing_kwargs: {use_reentrant: false}\nadam_beta2: 0.999\ngradient_checkpointing: null\n"
    )
    cfg = TrainConfig.from_yaml(path)
    assert (cfg.kernels, cfg.save_on_interrupt, cfg.collective_timeout_seconds) == ("liger", True, 600.0)
    assert cfg.activation_checkpointing is False  # null: the Trainer's "not set"
    assert TrainConfig.from_dict({"adam_beta1": None, "evaluation_strategy": None}) == TrainConfig()
    assert flags_config("--ddp_timeout", "1800").collective_timeout_seconds == 1800.0
    trl = flags_config(
        "--num_iterations", "2", "--epsilon", "0.1", "--epsilon-high", "0.3", "--precompute-ref-log-probs"
    )
    assert (trl.iterations_per_generation, trl.clip_epsilon, trl.clip_epsilon_high) == (2, 0.1, 0.3)
    assert trl.precompute_reference is True
    assert flags_config("--collective-timeout", "10m").collective_timeout_seconds == 600.0
    with pytest.raises(ConfigError, match=r"--collective-timeout: cannot read 'soon' as a time"):
        TrainConfig.from_dict({"collective_timeout": "soon"})


#: TRL's configs, and the task each trains
TRL_CONFIGS = {
    "DPOConfig": "dpo",
    "KTOConfig": "kto",
    "RewardConfig": "reward",  # reward-model's other name
    "SFTConfig": "sft",  # causal-lm's other name
    "GRPOConfig": "grpo",
}
#: the defaults of each (beyond TrainingArguments' train_sampling_strategy) that leantrain refuses, because it does
#: otherwise: a chat counts its assistant's tokens only, packing keeps the documents' order, and GRPO's beta is its
#: KL weight (leantrain's --kl-beta; --beta is DPO's)
TRL_REFUSED_DEFAULTS = {"SFTConfig": {"assistant_only_loss", "packing_strategy"}, "GRPOConfig": {"beta"}}


@pytest.mark.parametrize("config", sorted(TRL_CONFIGS))
def test_every_trl_config_field_has_a_row_and_its_defaults_train_where_leantrain_agrees(config):
    """Every field of the installed TRL's config is a leantrain setting of the same name or in the table (a field a
    new TRL adds fails here until it has its row). Each default alone with the config's task, and all of them in one
    file as `DPOConfig().to_dict()` writes them, train as TRL's defaults say, except the few where leantrain does
    otherwise; and the task reads every setting the file sets."""
    import dataclasses

    import trl

    from leantrain.config.hf_names import BY_NAME
    from leantrain.config.sections import unread_settings
    from leantrain.tasks.registry import canonical

    fields = dataclasses.fields(getattr(trl, config))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    assert sorted(f.name for f in fields if f.name not in BY_NAME and f.name not in known) == []
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        for f in fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    task = TRL_CONFIGS[config]
    refused = refused_alone(defaults, task)
    assert refused == {"train_sampling_strategy"} | TRL_REFUSED_DEFAULTS.get(config, set())
    dump = TrainConfig.from_dict({"task": task, **{k: v for k, v in defaults.items() if k not in refused}})
    # TRL's own defaults, carried over: its learning rate, bf16 unless fp16 (leantrain's auto), the activations
    # recomputed, every dropout off where its trainer turns dropout off
    assert (dump.lr, dump.precision, dump.activation_checkpointing) == (defaults["learning_rate"], "auto", True)
    assert dump.dropout == (0.0 if defaults.get("disable_dropout") else None)
    assert unread_settings(dump, canonical(task)) == {}


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"loss_type": "sigmoid"}, {"preference_loss": "sigmoid", "sft_weight": 0.0}),
        ({"loss_type": ["ipo"]}, {"preference_loss": "ipo"}),
        ({"loss_type": ["hinge", "sft"], "loss_weights": [1.0, 0.3]}, {"preference_loss": "hinge", "sft_weight": 0.3}),
        ({"loss_type": ["robust", "sft"]}, {"preference_loss": "robust", "sft_weight": 1.0}),
        ({"loss_type": "dapo"}, {"preference_loss": "sigmoid"}),  # GRPO's default: leantrain's GRPO loss
        ({"loss_type": "nll", "dataset_text_field": "body"}, {"text_column": "body"}),
        ({"completion_only_loss": False}, {"train_on_prompt": True}),
        ({"completion_only_loss": None, "assistant_only_loss": True}, {"train_on_prompt": False}),
        ({"disable_dropout": True, "task": "grpo"}, {"dropout": 0.0}),
        ({"disable_dropout": False, "task": "grpo", "shuffle_dataset": True}, {"dropout": None}),
        ({"remove_unused_columns": False, "task": "grpo"}, {"task": "grpo"}),
        ({"shuffle_dataset": False, "task": "causal-lm"}, {"task": "causal-lm"}),
        # padding-free batches only save padding: the loss is the padded batches', which leantrain computes
        ({"padding_free": True, "task": "causal-lm"}, {"task": "causal-lm", "packing": None}),
    ],
)
def test_trl_names_set_what_they_mean(given, says):
    cfg = TrainConfig.from_dict(given)
    assert {name: getattr(cfg, name) for name in says} == says


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"loss_type": "exo_pair"}, "loss_type exo_pair has no leantrain setting: leantrain computes DPO's sigmoid, "),
        ({"loss_type": "grpo"}, "GRPO's dapo, KTO's kto and SFT's nll"),
        ({"loss_type": ["sigmoid", "sft"], "loss_weights": [0.5, 1.0]}, "(weight 1, --preference-loss)"),
        ({"loss_weights": [1.0, 0.2]}, "loss_weights weighs the losses of loss_type; give both"),
        ({"disable_dropout": False, "task": "dpo"}, "dpo trains with every dropout off (as TRL's trainer for it"),
        ({"shuffle_dataset": False, "task": "grpo"}, "shuffle_dataset false has no leantrain setting: grpo shuffles"),
        ({"remove_unused_columns": False}, "grpo hands a row's others to reward functions"),
        ({"use_vllm": True}, "use_vllm (TRL's GRPOConfig) has no leantrain setting: GRPO: completions are sampled"),
        ({"vllm_mode": "server"}, "see use_vllm (GRPO: completions are sampled with transformers"),
        ({"scale_rewards": "batch"}, "(accepted: group or true)"),
        ({"task": "grpo", "beta": 0.0}, "grpo does not read it: its --kl-beta is what TRL's grpo trainer calls beta"),
    ],
)
def test_trl_names_leantrain_does_otherwise_are_refused_with_what_it_does(given, says):
    with pytest.raises(ConfigError) as refusal:
        TrainConfig.from_dict(given)
    assert says in str(refusal.value)


def test_trl_names_read_the_task_from_another_source(tmp_path, capsys):
    path = tmp_path / "dpo.yaml"
    path.write_text("disable_dropout: false\nloss_type: [sigmoid, sft]\nloss_weights: [1.0, 0.1]\n")
    with pytest.raises(ConfigError, match="dpo trains with every dropout off"):
        TrainConfig.from_yaml(path, overrides={"task": "dpo"})
    assert TrainConfig.from_yaml(path, overrides={"task": "grpo"}).dropout is None
    assert "dpo trains with every dropout off" in refused(capsys, "--task", "dpo", "--disable_dropout", "false")
    (tmp_path / "task.yaml").write_text("task: dpo\n")  # the task in the file, the TRL name a flag
    assert "dpo trains with every dropout off" in refused(
        capsys, "--config", str(tmp_path / "task.yaml"), "--disable_dropout", "false"
    )
    cfg = flags_config("--loss_type", "ipo,sft", "--loss_weights", "1,0.25", "--disable-dropout")
    assert (cfg.preference_loss, cfg.sft_weight, cfg.dropout) == ("ipo", 0.25, 0.0)
    assert TrainConfig.from_dict({"bf16": None, "fp16": False}).precision == "auto"  # TRL's: bf16 unless fp16
    assert TrainConfig.from_dict({"fp16": False}).precision == "fp32"  # the Trainer's: bf16 false unless given


@pytest.mark.parametrize("arguments", ["ModelConfig", "ScriptArguments"])
def test_every_field_of_trl_scripts_arguments_has_a_row_and_its_defaults_are_accepted(arguments):
    """TRL's scripts (`trl sft`, `trl dpo`, ...) take a ModelConfig and ScriptArguments beside the trainer's config:
    every field is a leantrain setting or in the table, and their defaults say what leantrain does."""
    import dataclasses

    import trl

    from leantrain.config.hf_names import BY_NAME

    fields = dataclasses.fields(getattr(trl, arguments))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    assert sorted(f.name for f in fields if f.name not in BY_NAME and f.name not in known) == []
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    dump = TrainConfig.from_dict({**defaults, "dataset_name": "data/pairs"} if "dataset_name" in defaults else defaults)
    if arguments == "ScriptArguments":  # the evaluation rows are the data set's test split, as TRL's scripts take
        assert (dump.data, dump.data_split, dump.eval_data, dump.eval_split) == (
            "data/pairs",
            None,
            "data/pairs",
            "test",
        )
    else:  # LoRA's settings keep TRL's values; without use_peft a run refuses them (leantrain's --lora-r needs --lora)
        assert (dump.lora, dump.quantize, dump.lora_r, dump.lora_targets, dump.attention) == (
            False,
            None,
            16,
            "auto",
            "auto",
        )


def test_a_trl_scripts_command_line_sets_what_it_means(capsys):
    cfg = flags_config(
        "--model_name_or_path", "my/model", "--dataset_name", "my/data", "--dataset_config", "en",
        "--dataset_train_split", "train[:90%]", "--dataset_test_split", "validation", "--use_peft",
        "--lora_target_modules", "q_proj,v_proj", "--load_in_4bit", "--attn_implementation", "eager",
        "--dtype", "float32", "--dataset_streaming", "false",
    )  # fmt: skip
    assert (cfg.model, cfg.data, cfg.data_config, cfg.data_split) == ("my/model", "my/data", "en", "train[:90%]")
    assert (cfg.eval_data, cfg.eval_split, cfg.lora, cfg.quantize) == ("my/data", "validation", True, "4bit")
    assert (cfg.lora_targets, cfg.attention, cfg.streaming) == ("q_proj,v_proj", "eager", False)
    assert TrainConfig.from_dict({"lora_target_modules": "all-linear"}).lora_targets == "auto"
    says = refused(capsys, "--dtype", "bfloat16")
    assert "dtype (TRL's ModelConfig) has no leantrain setting: the weights load in fp32, the optimizer's" in says
    for given, message in [
        ({"use_peft": True, "load_in_4bit": True, "use_bnb_nested_quant": False}, "use_bnb_nested_quant false has no"),
        ({"dataset_test_split": "test"}, "dataset_test_split names a split of dataset_name; give dataset_name too"),
        ({"load_in_4bit": True, "load_in_8bit": True}, "load_in_4bit and load_in_8bit both set quantize; give one"),
    ]:
        with pytest.raises(ConfigError, match=message):
            TrainConfig.from_dict(given)


@pytest.mark.parametrize("config", ["TrainingArguments", *sorted(TRL_CONFIGS)])
def test_a_config_as_to_dict_writes_it_trains_where_leantrain_agrees(config, tmp_path):
    """What a user saves of their arguments (`args.to_dict()` to YAML): the values __post_init__ worked out (report_to
    [], debug [], the accelerator_config's defaults, GRPO's generation_batch_size), the *_token fields masked as
    <NAME>. use_cpu is given because TRL's configs refuse to build for bf16 on a CPU without it: it is --cpu."""
    import transformers
    import trl
    import yaml

    cls = getattr(transformers, config, None) or getattr(trl, config)
    task = TRL_CONFIGS.get(config)
    written = cls(output_dir=str(tmp_path), use_cpu=True).to_dict()
    refused = refused_alone(written, task)
    assert refused == {"train_sampling_strategy"} | TRL_REFUSED_DEFAULTS.get(config, set())
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump({"task": task, **{k: v for k, v in written.items() if k not in refused}}))
    cfg = TrainConfig.from_yaml(path)
    # GRPO's 8 completions a device step are one prompt's group (leantrain's --batch-size counts prompts)
    assert (cfg.batch_size, cfg.report_to, cfg.cpu) == (1 if config == "GRPOConfig" else 8, "none", True)


def test_trl_grpo_counts_completions_in_its_batch():
    cfg = TrainConfig.from_dict({"task": "grpo", "per_device_train_batch_size": 16, "num_generations": 4})
    assert (cfg.batch_size, cfg.num_generations) == (4, 4)  # 4 prompts, 4 completions each
    with pytest.raises(ConfigError, match="counts completions in TRL's GRPO: a multiple of num_generations"):
        TrainConfig.from_dict({"task": "grpo", "per_device_train_batch_size": 12, "num_generations": 8})
    assert TrainConfig.from_dict({"per_device_train_batch_size": 12}).batch_size == 12  # other tasks: examples
    with pytest.raises(ConfigError, match="steps_per_generation 4 has no leantrain setting"):
        TrainConfig.from_dict({"task": "grpo", "steps_per_generation": 4})


def test_trl_names_older_recipes_carry_are_read_or_refused_with_the_reason(capsys):
    assert flags_config("--max_seq_length", "512").max_length == 512
    assert TrainConfig.from_dict({"torch_dtype": "float32"}) == TrainConfig()
    says = refused(capsys, "--max_prompt_length", "256")
    assert (
        "max_prompt_length (TRL before 1.0) has no leantrain setting: gone from TRL 1's configs: leantrain cuts" in says
    )
