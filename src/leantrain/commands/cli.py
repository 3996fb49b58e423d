"""The `leantrain` command: a thin layer over the Python API.

Heavy libraries are imported inside the commands, so `leantrain --help` answers at once.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
from dataclasses import MISSING, fields
from typing import Any

from leantrain.config import DATA_FORMATS, SECTIONS, TrainConfig, field_base_type, refuse_unswitched, to_flags
from leantrain.data.tags import AGGREGATIONS
from leantrain.errors import ConfigError, LeantrainError
from leantrain.telemetry.console import Console


class _Parser(argparse.ArgumentParser):
    """argparse that fails in one line, naming the flag and suggesting the closest known one."""

    def __init__(self, *args, **kwargs):
        # No prefix matching: `--epoch 3` or `--lr-sched x` is told as a typo with the closest flag, never taken as
        # whichever flag it happens to begin (a later flag sharing the prefix would silently change its meaning).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._argv = list(sys.argv[1:] if args is None else args)  # for `_value_after_a_switch`
        return super().parse_known_args(args, namespace)

    def _value_after_a_switch(self, value: str) -> str | None:
        """`--progress off`: the value was meant for the switch before it, which takes none; name the switch."""
        argv: list[str] = getattr(self, "_argv", [])
        switches = {o: a for p in _all_parsers(self) for a in p._actions if a.nargs == 0 for o in a.option_strings}
        for before, token in itertools.pairwise(argv):
            if token == value and before in switches:
                return f"{before} takes no value (got '{value}'): use {' or '.join(switches[before].option_strings)}"
        return None

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            bad = message.split(":", 1)[1].split()
            flag = next((b for b in bad if b.startswith("-")), None)
            if flag is None:
                message = self._value_after_a_switch(bad[0] if bad else "") or (
                    f"unexpected argument '{bad[0] if bad else ''}'; see `{self.prog} --help`"
                )
            else:
                message = self._unknown_flag(flag)
        self.exit(2, f"{self._command_prog()}: error: {message}\n")

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        return {
            command: sub
            for action in self._actions
            if isinstance(action, argparse._SubParsersAction)
            for command, sub in action.choices.items()
        }

    def _command(self) -> str | None:
        """The command the arguments name (`train`), which the top parser reports unknown flags for."""
        argv: list[str] = getattr(self, "_argv", [])
        return next((token for token in argv if token in self._commands()), None)

    def _command_prog(self) -> str:
        command = self._command()
        return f"{self.prog} {command}" if command else self.prog

    def _unknown_flag(self, flag: str) -> str:
        """One line for a flag the command does not take: the closest of the command's own flags, or, for another
        command's flag (`evaluate --eval-data`), which commands take it."""
        from leantrain.config import hf_names

        name = flag.split("=")[0]
        commands, command, prog = self._commands(), self._command(), self._command_prog()
        scope = _all_parsers(commands[command]) if command else _all_parsers(self)
        known = [o for p in scope for a in p._actions for o in a.option_strings]
        hint = hf_names.hint(name, known)
        elsewhere = [
            c for c, sub in commands.items() if c != command and any(name in a.option_strings for a in sub._actions)
        ]
        # another command's flag: a look-alike of this command's is named only when it is the same setting's
        # shorter name (evaluate --eval-data: --data), not a mere likeness (predict --lora: --format)
        near = hint.rsplit(" ", 1)[-1].rstrip("?").lstrip("-") if hint.startswith("; did you mean") else ""
        if hint and not hint.endswith(f" {name}?") and (not (command and elsewhere) or near in name):
            return f"unknown flag {name}{hint}"
        if command and elsewhere:
            takers = ", ".join(f"`{self.prog} {c}`" for c in elsewhere)
            return f"`{prog}` takes no {name} (a flag of {takers}); see `{prog} --help`"
        return f"unknown flag {name}; see `{prog} --help`"


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _all_parsers(sub)
    return found


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field; unset flags stay absent so YAML values are not overridden."""
    parser.add_argument("--config", metavar="YAML", help="YAML file of config keys; flags given here override it.")
    for section in SECTIONS:  # one help group per config section
        title = section.__name__.removesuffix("Config").lower()
        group = parser.add_argument_group(title, (section.__doc__ or "").strip())
        for f in fields(section):
            _add_flag(group, f)
    _add_alias_flags(parser)


def _add_alias_flags(parser: argparse.ArgumentParser) -> None:
    """HF Trainer users: TrainingArguments names as hidden flags (dest `hf__NAME`), translated by
    `leantrain.config.hf_names` in `config_from_args`; `--num-workers`, renamed, refused there in one line."""
    from leantrain.config import hf_names

    kinds = {f.name: field_base_type(f) for f in fields(TrainConfig)}
    for row in hf_names.cli_rows():
        kind = hf_names.cli_kind(row, kinds.get(row.field or ""))
        flag = hf_names.flag(row.hf)
        if kind is bool:
            parser.add_argument(
                flag,
                dest=f"hf__{row.hf}",
                nargs="?",
                const=True,
                type=_flag_bool(row.hf),
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
        else:
            parser.add_argument(
                flag, dest=f"hf__{row.hf}", type=_typed(kind, flag), default=argparse.SUPPRESS, help=argparse.SUPPRESS
            )
    for name in hf_names.RENAMED:
        parser.add_argument(hf_names.flag(name), dest=f"hf__{name}", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _flag_bool(name: str):
    def convert(text: str) -> bool:
        from leantrain.config import hf_names

        try:
            return hf_names.to_bool(name, text)
        except LeantrainError:
            raise argparse.ArgumentTypeError(f"needs true or false, got '{text}'") from None

    convert.__name__ = "bool"
    return convert


def _add_flag(parser, f) -> None:
    """The flag of one config field: `--no-X` too for booleans; absent unless given."""
    flag = "--" + f.name.replace("_", "-")
    default = f.default if f.default is not MISSING else None
    kind = field_base_type(f)
    help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
    # a default of None is "not set": the help says what happens then ("Default: ..."), not "(default: None)"
    shown = "" if default is None else f" (default: {default})"
    if kind is bool:
        parser.add_argument(
            flag,
            dest=f.name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=f"{help_text}{shown}",
        )
    elif f.metadata.get("sources"):  # --data, repeated for a mixture
        parser.add_argument(
            flag, dest=f.name, action="append", default=argparse.SUPPRESS, metavar="SOURCE",
            help=f"{help_text}{shown}",
        )  # fmt: skip
    else:
        parser.add_argument(
            flag,
            dest=f.name,
            type=_typed(kind, flag, epoch_ok=bool(f.metadata.get("epoch_ok"))),
            default=argparse.SUPPRESS,
            metavar=f.name.upper(),
            help=f"{help_text}{shown}",
        )


#: flags of a number of steps between two events, which TrainingArguments also takes as a fraction of the run
_EVERY_N_STEPS = ("--log-every", "--eval-every", "--save-every", "--logging-steps", "--eval-steps", "--save-steps")


def _fraction(text: str) -> bool:
    try:
        return 0 < float(text) < 1
    except ValueError:
        return False


def _typed(kind: type, flag: str, epoch_ok: bool = False):
    def convert(text: str) -> Any:
        if kind is str or (epoch_ok and text == "epoch"):  # --eval-every epoch
            return text
        try:
            return kind(text)
        except ValueError:
            wanted = ("an integer" if kind is int else "a number") + (" or 'epoch'" if epoch_ok else "")
            if flag in _EVERY_N_STEPS and _fraction(text):  # TrainingArguments reads 0.1 as a tenth of the run
                wanted = "a whole number of optimizer steps (a fraction of the run, as the HF Trainer takes it, is not)"
            raise argparse.ArgumentTypeError(f"needs {wanted}, got '{text}'") from None

    convert.__name__ = kind.__name__
    return convert


def _add_threshold_flag(parser) -> None:
    parser.add_argument(
        "--multi-label-threshold",
        type=_typed(float, "--multi-label-threshold"),
        help="Multi-label models: a label is predicted at this probability or above "
        "(default: the run's own --multi-label-threshold, else 0.5).",
    )


def build_parser() -> argparse.ArgumentParser:
    from leantrain._version import __version__

    parser = _Parser(prog="leantrain", description="Fine-tune Hugging Face transformer models efficiently.")
    parser.add_argument("--version", action="version", version=f"leantrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "train",
        help="Fine-tune a model (defaults: MiniLM on the embedded tweet corpus).",
        description="Train or fine-tune a model: text and sentence-pair classification, regression and multi-label "
        "text, images, audio, and causal language models (the task follows the model; --task overrides). Every flag "
        "is also a key of --config.",
    )
    _add_config_flags(p)
    p.add_argument(
        "--print-config",
        action="store_true",
        help="Print the resolved config (what config.yaml will record: defaults filled in, auto precision and the "
        "task's metric resolved) and exit without training.",
    )

    p = sub.add_parser(
        "bench",
        help="Compare throughput, memory and loss of each technique against fp32/AdamW.",
        description="Run the same short job under the fp32/AdamW baseline and under each technique "
        "(each in its own process), then print and save the comparison. Takes every "
        "`train` flag for the job itself.",
    )
    _add_config_flags(p)
    p.add_argument("--steps", type=int, default=30, help="Optimizer steps per technique (default: 30).")
    p.add_argument(
        "--full-epoch",
        action="store_true",
        help="Train each technique for --epochs instead of --steps, to compare final eval accuracy.",
    )
    p.add_argument(
        "--techniques",
        help="Comma-separated techniques (default: the usual ones, not compile). Known: baseline, bf16, fp16, "
        "grad_accum4, activation_ckpt, compile, torch_dropout, bf16+activation_ckpt, bf16+adafactor, lean, lora, "
        "qlora4bit, qlora8bit, precompute_reference and lora+precompute_reference (dpo, kto), and every --optimizer "
        "by its name.",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="Run the whole list this many times round-robin; keep each technique's median run.",
    )
    p.add_argument(
        "--bench-dir",
        help="Where runs, bench.csv, bench.png and bench.md go (default: --output-dir, else runs/bench-<time>).",
    )

    p = sub.add_parser(
        "plan",
        help="Predict memory and speed of every combination of techniques; recommend the fastest that fits.",
        description="Enumerate precision x activation checkpointing x optimizer x micro-batch (the global batch "
        "held fixed), predict each one's peak memory by part and its relative throughput, mark those that fit "
        "--memory and recommend the fastest. Takes every `train` flag for the job (`train --auto` trains "
        "with the recommendation).",
    )
    _add_config_flags(p)
    p.add_argument(
        "--global-batch",
        type=int,
        help="Examples per optimizer step (default: --batch-size x --grad-accum x --num-processes).",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="Plan for this device (default: this machine's).")
    p.add_argument("--probe", action="store_true", help="Run a few real steps of the top candidates and re-rank.")
    p.add_argument("--probe-top", type=int, default=3, help="Candidates to probe (default: 3).")
    p.add_argument("--probe-steps", type=int, default=5, help="Optimizer steps per probe (default: 5).")
    p.add_argument("--all", action="store_true", help="List every candidate, not one row per combination.")
    p.add_argument("--plan-dir", help="Write plan.json and plan.md (and the probes' runs) here.")

    sub.add_parser("env", help="Show the devices, precisions and library versions training would use here.")

    p = sub.add_parser("info", help="Show a model's config, parameter counts, head and labels.")
    p.add_argument(
        "model", nargs="?", default=None, help="Model folder, hub name or run directory (default: the embedded MiniLM)."
    )
    p.add_argument(
        "--num-labels",
        type=int,
        default=None,
        help="Labels of the new head on a model without a trained one (default: 2); a trained classifier shows its "
        "own.",
    )

    p = sub.add_parser(
        "evaluate",
        help="Score a trained run or model on a labelled file (or image/audio folder); a language model's loss and "
        "perplexity on a text.",
    )
    p.add_argument("model", metavar="RUN_OR_MODEL")
    p.add_argument(
        "--data",
        help="Labelled file to score, or a folder of images or audio files; for a language model, text (a .txt "
        "file, a folder of them, or a table; instruction rows add exact match). Default: the run's own held-out "
        "rows, held out as the run held them out.",
    )
    p.add_argument(
        "--metrics",
        help="Metrics to report, comma-separated, as `train --metrics` (default: the run's, else accuracy,macro_f1).",
    )
    p.add_argument(
        "--task",
        help="Score as this task instead of the run's own: e.g. causal-lm for a preference-tuned (dpo, kto) model's "
        "loss, perplexity and exact match on instruction rows.",
    )
    _add_column_flags(p, label=True)
    p.add_argument(
        "--label-separator",
        help="Multi-label models: the character joining a row's labels (default: the run's own --label-separator).",
    )
    p.add_argument(
        "--max-target-length",
        type=int,
        help="Seq2seq: the loss counts at most this many tokens of each reference (the scores compare whole texts); "
        "generation stops there too unless the run set --generation-max-new-tokens (default: the run's).",
    )
    p.add_argument(
        "--generation-max-new-tokens",
        type=int,
        help="Seq2seq: tokens the model writes at most per example (default: the run's, else --max-target-length).",
    )
    _add_threshold_flag(p)

    p = sub.add_parser("predict", help="Predict labels with probabilities for texts, images or audio files.")
    p.add_argument("model", metavar="RUN_OR_MODEL")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--text",
        action="append",
        help="A text to classify, or a prompt for a language model (repeatable); an empty prompt generates from the "
        "BOS token.",
    )
    src.add_argument("--file", action="append", help="An image or audio file to classify (repeatable).")
    src.add_argument("--data", help="File of texts to classify, or a folder or table of images or audio files.")
    p.add_argument("--output", help="Write predictions here (.jsonl, .csv or .tsv) instead of stdout.")
    _add_column_flags(p, label=False)
    _add_threshold_flag(p)
    # --- causal LM
    p.add_argument(
        "--max-new-tokens",
        type=int,
        help="Language models: tokens to generate (default: 32; seq2seq: the run's --generation-max-new-tokens).",
    )
    p.add_argument("--temperature", type=float, help="Language models: sample at this temperature (default: greedy).")
    p.add_argument("--top-p", type=float, help="Language models: sample from the top-p probability mass.")
    p.add_argument(
        "--aggregation",
        choices=AGGREGATIONS,
        help="Token classifiers: how tokens' tags become entities, as the pipeline's aggregation_strategy (default: "
        "the run's, first).",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="Language models: each text is a user's message, rendered with the model's chat template (a "
        "'messages' column in --data is read as chats without it).",
    )

    p = sub.add_parser(
        "report",
        help="Write a self-contained HTML report of a run (plots, config, environment).",
        description="Render RUN_DIR/report.html from the run's metrics.json, metrics.jsonl and "
        "config.yaml: loss, learning rate, evaluation, throughput and MFU, the time "
        "breakdown, memory, the resolved config and the environment.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--output", help="Where to write the page (default: RUN_DIR/report.html).")

    p = sub.add_parser(
        "compare",
        help="Compare runs side by side: config differences, metrics, throughput, memory.",
        description="Print two or more runs side by side (only the config keys that differ); with --output, "
        "also write a comparison chart.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--output", help="Also write a comparison chart to this PNG file (default: no chart).")
    return parser


def _add_column_flags(p: argparse.ArgumentParser, label: bool) -> None:
    from leantrain.config.sections import PRECISIONS

    p.add_argument(
        "--precision",
        choices=[c for c in PRECISIONS if c != "auto"],
        help="Compute in this precision (default: the run's own; fp32 for a model leantrain did not train).",
    )
    p.add_argument("--text-column")
    p.add_argument("--text-pair-column")
    if label:
        p.add_argument("--label-column")
    p.add_argument("--source-column", help="Seq2seq: the column of texts to transform (guessed when obvious).")
    if label:
        p.add_argument("--target-column", help="Seq2seq: the column of reference texts (guessed when obvious).")
    p.add_argument("--image-column", help="Images: the table column holding them (guessed when obvious).")
    p.add_argument("--audio-column", help="Audio: the table column holding it (guessed when obvious).")
    p.add_argument("--tokens-column", help="Token classification: the column of each row's words (guessed: tokens).")
    if label:
        p.add_argument("--label-pattern", help="Images/audio: regular expression taking the label from each path.")
        p.add_argument("--tags-column", help="Token classification: the column of each row's tags (guessed: ner_tags).")
        p.add_argument("--spans-column", help="Token classification: the column of each text's entity spans.")
        p.add_argument(
            "--tag-column", type=int, help="Token classification, CoNLL: the tag's column (from 1; -1: last)."
        )
        p.add_argument("--tag-scheme", help="Token classification: iob1|iob2|bioes|none (default: detected).")
        p.add_argument(
            "--reward-column",
            help="GRPO: the column the rewards compare completions with (guessed when obvious: answer, solution, ...).",
        )
    default = "the run's --max-length" + (
        "; a language model leantrain did not train: its context, at most 1,024" if label else ""
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"Cut inputs at this many tokens (default: {default}; seq2seq: the sources, in place of the run's "
        "--max-source-length).",
    )
    p.add_argument("--batch-size", type=int, help="Examples per batch (default: the run's evaluation batch, else 64).")
    # how to read --data, as `train` reads it
    p.add_argument("--format", choices=DATA_FORMATS, help="Read --data in this format whatever its suffix.")
    p.add_argument("--column-names", help="Comma-separated column names for a CSV/TSV file without a header row.")
    p.add_argument("--data-config", help="Configuration of a hub data set or a `datasets` folder with several.")
    p.add_argument("--split", help="Split of a hub data set or `datasets` folder (default: validation, dev, test).")


def _read_options(args: argparse.Namespace):
    from leantrain.data.sources import ReadOptions

    names = tuple(n.strip() for n in args.column_names.split(",")) if args.column_names else None
    return ReadOptions(config=args.data_config, split=args.split, column_names=names, format=args.format)


def _task_in(path: str) -> str | None:
    """The task a --config file names, if it reads as one (else from_yaml says what is wrong with it)."""
    from pathlib import Path

    import yaml

    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return values.get("task") if isinstance(values, dict) and isinstance(values.get("task"), str) else None


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    from leantrain.config import hf_names

    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    if isinstance(given.get("data"), list) and len(given["data"]) == 1:
        given["data"] = given["data"][0]  # one --data: the path as it always was
    aliases = {k.removeprefix("hf__"): v for k, v in vars(args).items() if k.startswith("hf__")}
    task = given.get("task") or (_task_in(args.config) if args.config else None)  # for TRL's names that depend on it
    given = hf_names.translate({**given, **aliases}, "flags", task=task)  # TrainingArguments (and TRL) names
    for name, value in given.items():
        setattr(args, name, value)  # `bench` and `plan` read the job's flags from args
    if args.config:
        cfg = TrainConfig.from_yaml(args.config, overrides=given)
    else:
        cfg = TrainConfig.from_dict(given, source="flags")
    # told here, where a flag given is known: --eval-fraction has a default, and a run's config.yaml records both
    if "eval_fraction" in given and cfg.eval_data is not None:
        raise ConfigError(
            f"--eval-fraction {given['eval_fraction']} holds out a share of --data, but --eval-data gives the "
            "evaluation rows, so it would be ignored: leave --eval-fraction out, or drop --eval-data to hold rows out"
        )
    if "eval_fraction" in given and cfg.eval_pattern is not None:
        raise ConfigError(
            f"--eval-fraction {given['eval_fraction']} holds out a share of --data, but --eval-pattern picks the "
            "evaluation files, so it would be ignored: leave one of them out"
        )
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from leantrain.commands import launch

    cfg = config_from_args(args)
    refuse_unswitched(cfg)  # before any process starts: --lora-r without --lora would train the whole model
    if args.print_config:
        return _print_config(cfg)
    launch.check_shard(cfg)
    if launch.needs_launch(cfg):  # several processes or machines, or Ray: start them, each runs this again
        return launch.launch(cfg)
    launch.check_launched(cfg)
    if launch.launched():
        launch.die_with_parent()  # a launcher killed outright takes its processes with it
    rank, world = launch.rank_info()
    from leantrain.api import train
    from leantrain.training import interrupt
    from leantrain.training.hooks import StartupOver

    # Ctrl-C and SIGTERM stop at the next step boundary, with a checkpoint (training/interrupt.py)
    # the command's start-up ran without cyclic collection (`entry`): it resumes at the first micro-batch
    hooks = None if gc.isenabled() else StartupOver()
    logs = launch.failure_logs(cfg.output_dir) if world > 1 else None
    with interrupt.handling(launched=launch.launched()), launch.report_failure(rank, world, logs):
        try:
            result = train(cfg, hooks=hooks)
        except interrupt.Interrupted as stopped:
            if rank == 0:
                print(f"leantrain train: {stopped.message}", file=sys.stderr, flush=True)
            elif world > 1:
                print(f"leantrain train: process {rank} of {world} {stopped.message.split(';')[0]}", file=sys.stderr)
            return stopped.exit_code
        late = interrupt.received()
    if rank == 0:
        launch.print_result(result.metrics, result.model_dir)
        if late is not None:
            print(
                f"leantrain train: {interrupt.signal_name(late)} came after the last step; the run finished",
                file=sys.stderr,
            )
    return 0


def _print_config(cfg: TrainConfig) -> int:
    """`train --print-config`: the config as the run would record it, without training."""
    import yaml

    from leantrain.config import resolved_values
    from leantrain.job import assemble
    from leantrain.tasks.registry import recorded_name
    from leantrain.training.early_stopping import resolve_metric

    job = assemble(cfg)
    processes = job.cfg.num_processes or int(os.environ.get("WORLD_SIZE", "1"))
    values = resolved_values(
        job.cfg, precision=job.precision, metric_for_best=resolve_metric(job.cfg, job.task), num_processes=processes,
        task=recorded_name(type(job.task)),
    )  # fmt: skip
    print(f"# precision {job.precision}: {job.precision_why}")
    if job.cfg.auto:
        print("# --auto: the planner sets precision, activation checkpointing, optimizer and the batch split at start")
    print(yaml.safe_dump(values, sort_keys=False).rstrip())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from leantrain.commands import bench

    base_cfg = config_from_args(args)  # validates the job before anything runs
    given = {
        f.name: getattr(base_cfg, f.name)
        for f in fields(TrainConfig)
        if hasattr(args, f.name) or (args.config and getattr(base_cfg, f.name) != f.default)
    }
    output_dir = given.pop("output_dir", None)  # each technique's run has its own folder under the bench's
    if args.steps <= 0:
        raise LeantrainError(f"--steps must be a positive integer, got {args.steps}")
    names = bench.parse_techniques(args.techniques)
    say = Console().info
    if "torch_dropout" in names and base_cfg.dropout_or_default() == 0:
        say(
            "bench: torch_dropout compares dropout's draws, and this job trains without dropout (--dropout 0"
            + (", the default job's" if base_cfg.data is None else "")
            + "): it will run as the baseline; add --dropout 0.1 to compare the draws"
        )
    # --output-dir, as `train` takes it, names the bench's folder when --bench-dir does not
    bench_dir = Path(args.bench_dir or output_dir or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.repeats <= 0:
        raise LeantrainError(f"--repeats must be a positive integer, got {args.repeats}")
    rows = bench.run_bench(
        given, names, None if args.full_epoch else args.steps, bench_dir, say=say, repeats=args.repeats
    )
    records = bench.table_rows(rows)
    context = {
        **bench.environment_context(),
        "job": " ".join(to_flags(given)) or "(defaults)",
        "steps": "full epochs" if args.full_epoch else args.steps,
        "repeats": args.repeats,
    }
    paths = bench.write_outputs(records, bench_dir, context)
    print(bench.render(records).rstrip())
    print(f"written: {paths['md']}, {paths['csv']}, {paths['png']}")
    return 0 if all(r.error is None for r in rows) else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from leantrain.commands.plan import PlanOptions, run_plan

    cfg = config_from_args(args)
    given = {  # the job's own flags (and YAML keys), for the probes
        f.name: getattr(cfg, f.name)
        for f in fields(TrainConfig)
        if hasattr(args, f.name) or (args.config and getattr(cfg, f.name) != f.default)
    }
    options = PlanOptions(args.global_batch, args.device, args.probe, args.probe_top, args.probe_steps, args.plan_dir)
    say = Console().info
    plan, paths = run_plan(cfg, options, given, say=say)
    print(plan.render(all_rows=args.all).rstrip())
    if paths:
        print(f"written: {paths['json']}, {paths['md']}")
    return 0 if plan.recommended is not None else 1


def cmd_env(args: argparse.Namespace) -> int:
    from leantrain.parallel import environment_report
    from leantrain.telemetry import summary_table

    print(summary_table("leantrain env", environment_report()).rstrip())
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from leantrain import tasks
    from leantrain.job import HF_PROBLEM_TYPES
    from leantrain.model import loading

    if args.num_labels is not None and args.num_labels < 1:
        raise LeantrainError(f"--num-labels must be a positive integer, got {args.num_labels}")
    path = loading.resolve_model(args.model)
    config = loading.load_config(path)
    task = tasks.task_class(tasks.infer(config))
    labelled = task.auto_model.endswith("Classification")  # a language model's head scores its vocabulary
    own = not labelled or loading.has_trained_head(path, config, task.model_mapping)
    if own:  # described as saved: its own head and labels, which --num-labels would not fit
        if args.num_labels is not None and not (labelled and args.num_labels == config.num_labels):
            held = f"has a trained head ({config.num_labels} labels)" if labelled else f"is a {task.name} model"
            Console().info(f"--num-labels {args.num_labels} does not apply: {path} {held}")
        import transformers

        auto = getattr(transformers, task.auto_model)
        with loading.library_bars_off():  # a refusal stays one line
            model = loading.weights_or_random(auto, path, config, False, f"a {task.name} model")
    else:
        labels = [f"LABEL_{i}" for i in range(args.num_labels or 2)]
        with loading.library_bars_off():
            model = loading.load_for_classification(path, labels, auto_model=task.auto_model)
    counts = loading.count_parameters(model)
    print(model.config)
    print(f"architecture     {type(model).__name__} ({task.name})")
    print(
        f"parameters       {counts.total:,} total, {counts.trainable:,} trainable, "
        f"{counts.embeddings:,} in embeddings, {counts.non_embedding:,} outside them"
    )
    head = loading.classification_head(model)
    if not labelled:
        print(f"head             {head} (a score per vocabulary token)")
    elif not own:
        print(f"head             {head} (new, untrained)")
        print(f"labels           {model.config.num_labels} (--num-labels; a trained model shows its own)")
    else:
        names = [str(name) for _, name in sorted(model.config.id2label.items())]
        kind = HF_PROBLEM_TYPES.get(model.config.problem_type or "", "single-label")
        shown = ", ".join(names[:10]) + (f", … and {len(names) - 10} more" if len(names) > 10 else "")
        print(f"head             {head}")
        print(f"labels           {len(names)} ({kind}): {shown}")
    limit = loading.max_supported_length(model.config)
    print(f"max input length {limit if limit is not None else 'not stated'}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from leantrain.inference import evaluate

    _check_sizes(args)
    metrics = evaluate(
        args.model,
        args.data,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        label_column=args.label_column,
        max_length=args.max_length,
        batch_size=args.batch_size,
        image_column=args.image_column,
        audio_column=args.audio_column,
        label_pattern=args.label_pattern,
        metrics=args.metrics,
        label_separator=args.label_separator,
        threshold=args.multi_label_threshold,
        read=_read_options(args),
        precision=args.precision,
        task=args.task,
        tokens_column=args.tokens_column,
        tags_column=args.tags_column,
        spans_column=args.spans_column,
        tag_column=args.tag_column,
        tag_scheme=args.tag_scheme,
        source_column=args.source_column,
        target_column=args.target_column,
        reward_column=args.reward_column,
        max_target_length=args.max_target_length,
        generation_max_new_tokens=args.generation_max_new_tokens,
    )
    if "per_class" in metrics:  # the per-class table and the confusion matrix, for a person to read
        from leantrain.tasks.scoring import format_report

        print(format_report(metrics), file=sys.stderr)
    from leantrain.telemetry.metrics import plain_json

    print(json.dumps(plain_json(metrics), indent=2))  # strict JSON (jq and the like): an undefined score as "nan"
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from leantrain.inference import predict, write_predictions
    from leantrain.inference.api import check_output

    _check_sizes(args)
    if args.output:
        check_output(args.output)  # before the model is loaded and run
    rows = predict(
        args.model,
        texts=args.text,
        data=args.data,
        files=args.file,
        image_column=args.image_column,
        audio_column=args.audio_column,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        threshold=args.multi_label_threshold,
        chat=args.chat,
        read=_read_options(args),
        precision=args.precision,
        tokens_column=args.tokens_column,
        aggregation=args.aggregation,
        source_column=args.source_column,
    )
    write_predictions(rows, args.output, sys.stdout)
    if args.output:
        print(f"written: {args.output} ({len(rows):,} prediction{'s' if len(rows) != 1 else ''})", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from leantrain.run.report import write_report

    print(write_report(args.run_dir, args.output))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from leantrain.run.compare import compare

    path = compare(args.run_dirs, args.output)
    if path is not None:
        print(f"written: {path}")
    return 0


def _check_sizes(args: argparse.Namespace) -> None:
    for name in ("max_length", "batch_size", "max_target_length", "generation_max_new_tokens"):
        if getattr(args, name, None) is not None and getattr(args, name) <= 0:
            raise LeantrainError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")


COMMANDS = {
    "train": cmd_train,
    "bench": cmd_bench,
    "plan": cmd_plan,
    "env": cmd_env,
    "info": cmd_info,
    "evaluate": cmd_evaluate,
    "predict": cmd_predict,
    "report": cmd_report,
    "compare": cmd_compare,
}


def _dashed(argv: list[str]) -> list[str]:
    """`--learning_rate` and `--learning-rate` alike: flag names with '_' as '-' (values untouched)."""
    out = []
    for token in argv:
        if token.startswith("--") and "_" in token.split("=", 1)[0]:
            name, eq, value = token.partition("=")
            token = name.replace("_", "-") + eq + value
        out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_dashed(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or a usage error already printed in one line
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    from leantrain.parallel.threads import prepare_environment

    prepare_environment()  # before torch loads: OpenMP reads its settings once
    _quiet_libraries()
    try:
        return COMMANDS[args.command](args)
    except LeantrainError as exc:
        if getattr(exc, "told_in", None) is None:  # (another process of a job: said in its log, once in all)
            print(f"leantrain {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"leantrain {args.command}: {getattr(exc, 'message', None) or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def entry() -> int:
    """The `leantrain` command (and `python -m leantrain`): `main`, with Python's cyclic garbage collection kept
    off what lives to the end (benchmarks/results/exit.md). Not in `main`, which tests call in one long-lived
    process.

    `train`'s start-up (imports, data, the model) makes about half a million objects that live to the end; the
    collector walked them all seven times as they came (1.2-1.6 s on 2 cores), so it is off until the first
    micro-batch (`training.hooks.StartupOver`; start-up leaves about 40,000 objects of cyclic garbage, a few
    MB). At the exit, after `main`, every object is frozen: Python's last collection would walk them all again
    (2.0-2.5 s). Objects are still freed as their counts reach zero and atexit handlers still run."""
    if sys.argv[1:2] == ["train"]:
        gc.disable()
    sys.stdout, sys.stderr = ReaderMayLeave(sys.stdout), ReaderMayLeave(sys.stderr)
    code = main()
    gc.freeze()
    return code


class ReaderMayLeave:
    """A console stream whose reader may go away (`leantrain train 2>&1 | head`): once it has, what follows goes to
    the null device instead of failing the write, so a run goes on to its end with its files written as ever (its
    metrics are in the run directory), rather than dying at its next line with the output folder half made."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        try:  # the stream's own descriptor now leads nowhere: its buffered text, and the flush at exit, too
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _quiet_libraries() -> None:
    """Keep the libraries' advice out of the user's terminal (hub downloads keep their progress bars)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


if __name__ == "__main__":
    sys.exit(entry())
