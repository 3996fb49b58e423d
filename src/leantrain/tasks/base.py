"""The task interface: everything that differs between workloads, so the trainer never branches on one.

A task turns a config into data and a model, batches examples, computes the loss and scores predictions; it also
says what the rest of leantrain needs to know of it (its names, its `AutoModelFor...` class, the `pipeline` its
model serves, whether the planner models it) and how `leantrain evaluate` and `predict` prepare inputs and turn
outputs into rows. The trainer (leantrain.training) imports this module and nothing else from `tasks/` but the
shared parts: a new workload is a new `Task` subclass, registered with `leantrain.tasks.register` (the built-ins
are registered the same way) or passed to `leantrain.train(task=...)`.

Loss normalisation is the trainer's, and exact: a task returns the loss *summed* over the units it counts
(examples for sequence tasks, tokens for token tasks), and the trainer divides by the units of the whole
optimizer step across micro-batches and processes, which the sampler knows before the step begins. A task that
makes a step's examples itself while training (`makes_examples`: completions generated from the sampled prompts)
gives their units with them, and the trainer adds those up across processes before the step's first backward.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch


@dataclass
class TaskData:
    """A task's prepared data: what the trainer batches, evaluates and saves beside the model."""

    #: training examples (`data.prepare.Examples`: features and labels, batched through
    #: `data.batching.ExamplesDataset`)
    train: Any
    eval: Any
    #: class names, in label-id order (empty for tasks without classes)
    label_names: list[str]
    #: the tokenizer or media processor: saved with the model so that `predict` prepares inputs alike
    processor: Any
    #: what the user should hear about the data (one line each)
    notes: list[str] = field(default_factory=list)
    #: a model config sized to the data (a preset's audio length, say); None: the model's own
    model_config: Any = None
    #: what `leantrain evaluate` reports about the data beside the scores (examples, documents, rows skipped)
    facts: dict[str, Any] = field(default_factory=dict)
    #: a mixture's sources by name: what was asked of each and found in it (rows, requested share, duplicates,
    #: contaminated evaluation rows), for metrics.json; empty for one source
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class PredictionInputs:
    """What `leantrain predict` was given besides a table (a table is the config's `eval_data`)."""

    #: --text: texts (or prompts) to predict on
    texts: list[str] | None = None
    #: --file: files (images, audio)
    files: list[str] | None = None
    #: --chat: each text is a user's message, rendered with the model's chat template
    chat: bool = False
    #: a generating task's settings: max_new_tokens, temperature, top_p
    generation: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingContext:
    """What a task's training hooks (`Task.before_training`, `Task.begin_step`, `Task.step_examples`) may use of
    the run."""

    #: the run's Accelerator (process facts, `reduce`, `gather`, the device)
    accelerator: Any
    #: a context manager factory: the autocast the trainer runs the model's forward in
    autocast: Callable[[], Any]
    #: the run's precision, resolved: "fp32", "bf16" or "fp16"
    precision: str
    #: prints a line for the user (the main process's console)
    say: Callable[[str], None]
    #: (micro-batch i of the step, a sub-batch's key) -> a context manager within which the models run that
    #: sub-batch with attention masks made from what the host knows of it (`model.masks`), not read on the device
    host_masks: Callable[[int, str], Any] = lambda i, part: contextlib.nullcontext()
    #: the attention kernel the run's evaluations use (no backward pass): what a task's own generation runs
    generation_attention: str | None = None


class Task(ABC):
    """One workload. Subclasses set `name` and `input_names` and implement the abstract methods."""

    #: the `--task` name
    name: ClassVar[str]
    #: other spellings `--task` accepts (`leantrain.tasks.register` reads them)
    aliases: ClassVar[tuple[str, ...]] = ()
    #: the batch keys the model takes as keyword arguments
    input_names: ClassVar[tuple[str, ...]]
    #: the transformers `AutoModelFor...` class that builds its model and loads a trained one
    auto_model: ClassVar[str] = "AutoModel"
    #: transformers' table of the model types that can do it (a name in `transformers.models.auto.modeling_auto`),
    #: for telling the task from a model's config when `--task` is not given; "" for none
    model_mapping: ClassVar[str] = ""
    #: endings of architecture names (a config's `architectures`) that mean this task
    architectures: ClassVar[tuple[str, ...]] = ()
    #: the `transformers.pipeline` task that the published model/ serves
    pipeline: ClassVar[str] = ""
    #: how the planner models its memory and speed: "classifier" (an encoder with a head), "token-classifier",
    #: "causal-lm" or "seq2seq" (an encoder-decoder); None: not
    #: modelled (`leantrain plan` and `--auto` refuse it in one line)
    planner: ClassVar[str | None] = None
    #: whether `predict` generates text (and takes --chat and the sampling settings)
    generates: ClassVar[bool] = False
    #: whether an empty --text is an input: a language model generates from its BOS token alone, as transformers'
    #: text-generation pipeline does; a classifier would label nothing, a translator translate nothing
    empty_prompts: ClassVar[bool] = False

    #: how its reader takes a folder that is no `datasets` save (`data.sources.PLAIN_FOLDERS`): with splits and
    #: configurations to choose from ("dataset"), or read whole (class folders, text files)
    plain_folder: ClassVar[str] = "dataset"
    #: whether `prepare_data` can leave the training examples a stream (`--streaming`)
    streams: ClassVar[bool] = False
    #: whether the task makes each optimizer step's examples from the sampled ones while training
    #: (`step_examples`: completions generated from prompts), their loss units known only then
    makes_examples: ClassVar[bool] = False
    #: metrics of `train_metrics` the progress bar shows beside the loss
    shown_while_training: ClassVar[tuple[str, ...]] = ()
    #: whether it compares the model with a reference model (preference tuning: `--precompute-reference` applies)
    uses_reference: ClassVar[bool] = False
    #: whether its `build_model` turns the model's dropout off (as TRL's preference and reward trainers do), which
    #: the planner then counts; --dropout still sets it
    dropout_off: ClassVar[bool] = False
    #: whether the config is read back from a trained run by evaluate and predict (`job.assemble`): a setting it
    #: recorded is read as it was, not refused as one a new run would be
    recorded: bool = False
    #: there, the settings given to evaluate or predict itself (flags, or the call's arguments): checked as train
    #: checks them, for the user typed them
    given: frozenset[str] = frozenset()

    def __init__(self, cfg: Any):
        self.cfg = cfg
        #: what loading the model did to a trained head (replaced for other labels), for `model_notes`
        self.head_notes: list[str] = []

    @classmethod
    def for_config(cls, cfg: Any) -> Task:
        """The task object for `cfg`; a task with variants (text classification's --problem-type) picks one."""
        from leantrain.errors import ConfigError

        problem = getattr(cfg, "problem_type", "single-label")
        if problem != "single-label":
            raise ConfigError(f"--problem-type {problem} is for text classification, not the {cls.name} task")
        for flag in ("precompute_reference", "reference_model"):
            if getattr(cfg, flag, None) and not cls.uses_reference:
                name = "--" + flag.replace("_", "-")
                raise ConfigError(f"{name}: the {cls.name} task has no reference model; leave it out")
        return cls(cfg)

    @classmethod
    def cannot_train(cls, model_config: Any, able: list[str]) -> str:
        """Why `--task NAME` refuses a model whose type does only the tasks `able`: one line with the fix."""
        kind = getattr(model_config, "model_type", None)
        return f"--task {cls.name}: a '{kind}' model cannot do it (it does {', '.join(able)})"

    # -- data and model ----------------------------------------------------------------------------------
    @abstractmethod
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        """Read, label, split and tokenize (or process) the data the config names, using the cache."""

    @abstractmethod
    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        """The model to train, its head sized from the data."""

    def model_notes(self) -> list[str]:
        """Lines for the user on what `build_model` changed in the model it loaded, shown after its description."""
        return list(getattr(self, "head_notes", []))  # a task of one's own may not call Task.__init__

    @property
    def packing(self) -> bool:
        """Whether training lays several sequences in one row (their attention must then keep them apart: the
        task's `check_model` checks the kernel that trains, and evaluations keep it)."""
        return False

    def check_model(self, model: torch.nn.Module) -> None:  # noqa: B027 (most tasks have nothing to check)
        """Refuse (ConfigError) a model that cannot train as configured, once its attention kernel is chosen."""

    @abstractmethod
    def collator(self, data: TaskData, *, train: bool) -> Callable[[list[dict]], dict[str, Any]]:
        """Batches examples. Every batch carries, besides the model's inputs: `labels`, `index` (example ids),
        `step_units`, `units` and `step_end` (`data.batching.slot_fields`), `num_tokens` and `padded_tokens`
        (0 without tokens): what loss normalisation and throughput need."""

    def flop_input_shapes(self, data: TaskData) -> dict[str, tuple[int, ...]] | None:
        """Fixed input shapes of one example, for counting FLOPs; None: token sequences of varying length."""
        return None

    # -- a step --------------------------------------------------------------------------------------------
    def model_inputs(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {k: batch[k] for k in self.input_names if k in batch}

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The model's outputs for one batch, in training and evaluation (a task may compute less of the output
        than the model would, for `loss_sum` and `eval_rows` to read)."""
        return model(**self.model_inputs(batch))

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        """On how many rows `forward` runs the model's tail when on fewer than one per token (FLOP counting); None:
        every token's."""
        return None

    def tail_flops(self, model: torch.nn.Module) -> float:
        """FLOPs per row (forward + backward) of the part of the model that `forward` runs on `tail_rows` rows only;
        0: `forward` runs the whole model on every token."""
        return 0.0

    def before_training(self, model: torch.nn.Module, data: TaskData, context: TrainingContext) -> None:  # noqa: B027
        """Once the model is placed on its device (Accelerate's `prepare`), before a checkpoint is restored into it and
        before the first step: what the task takes from the initial model (a preference task's reference model, or
        its log-probabilities precomputed over `data`). Every process calls it."""

    def frozen_models(self) -> list[tuple[torch.nn.Module, Any]]:
        """Models the task runs on each micro-batch beside the trained one, each with the autocast it runs in (a
        preference task's frozen reference): the trainer hands them the same host-known masks (`model.masks`)."""
        return []

    def begin_step(self, model: torch.nn.Module, batches: list[dict[str, Any]], context: TrainingContext) -> None:  # noqa: B027
        """Before an optimizer step's micro-batches on this process (`batches`: all of them, in order): what each
        micro-batch's loss needs from the whole step (KTO's KL baseline, all-reduced across processes). Every process
        calls it at every step."""

    def step_examples(
        self, model: torch.nn.Module, batches: list[dict[str, Any]], step: int, context: TrainingContext
    ) -> list[dict[str, Any]]:
        """With `makes_examples`: the micro-batches this process trains on in optimizer step `step` (counting from 0),
        made from the sampled ones (`batches`: all of the step's on this process, in order), as many and in the same
        order, e.g. the prompts' generated completions. Each carries the batch keys `collator` documents, its `units`
        those of the examples made; the trainer then sets every micro-batch's `step_units` to the step's units
        summed across processes. Runs in the trainer's autocast, timed as generation; every process calls it at
        every step."""
        raise NotImplementedError(f"{type(self).__name__} sets makes_examples but has no step_examples")

    @classmethod
    def planned_reference(cls, cfg: Any) -> tuple[float, bool]:
        """How the planner models the task's reference model: forward passes without gradients each step, in
        training's tokens (1: every sequence once more), and whether a frozen copy of the weights is held."""
        return 0.0, False

    def training_facts(self) -> dict[str, Any]:
        """What metrics.json reports of the task's own costs (a reference model's bytes, the seconds its
        log-probabilities took to precompute)."""
        return {}

    def train_sums(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """What the task logs while training beside the loss, as sums over the batch (scalar tensors, the same keys
        every batch): the trainer adds them up over the log window and across processes, and `train_metrics` turns
        the totals into the logged values. None logged by default."""
        return {}

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The metrics logged with the loss (metrics.jsonl) from `train_sums`' totals over the log window."""
        return {}

    def training_state(self) -> dict[str, Any] | None:
        """What this process's task holds between optimizer steps that a resumed run needs to go on exactly as the run
        would have (generations that later steps reuse): tensors, numbers, lists and dicts of them, saved in this
        process's checkpoint file. None: nothing."""
        return None

    def load_training_state(self, state: dict[str, Any] | None) -> None:  # noqa: B027
        """Restore what `training_state` returned (on resume, in the same process rank)."""

    def loss_units(self, data: TaskData) -> np.ndarray | None:
        """What `loss_sum` counts for each training example of `data.train` (counted tokens, or a class weight):
        the trainer divides by their sum over the optimizer step. None: one unit per example."""
        return None

    @abstractmethod
    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's loss summed (not averaged) over the units it counts, in float32."""

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor | None:
        """Each example's part of `loss_sum` (batch,), detached: a mixture's training loss per source. None: the task
        cannot say (the log then holds each source's share of the examples, not its loss)."""
        return None

    # -- evaluation ----------------------------------------------------------------------------------------
    @abstractmethod
    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Per-example results of an evaluation batch (first dimension: the batch), gathered across
        processes by the evaluator and handed to `metrics`."""

    @abstractmethod
    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        """Scores over every evaluation example (loss included)."""

    #: the metrics `metrics` reports, which `--metric-for-best` may name (leantrain.tasks.scoring.LOWER_IS_BETTER says
    #: which improve downwards); a task may set its own per instance (`--metrics`)
    metric_names: tuple[str, ...] = ("loss",)
    #: what `--metric-for-best` is when not given
    default_metric: ClassVar[str] = "loss"

    # --- metrics and losses
    #: a user's `compute_metrics(EvalPrediction) -> {name: number}` (`leantrain.train(compute_metrics=...)`), as
    #: the HF Trainer takes it: its scores join the task's own
    compute_metrics: Callable[[Any], dict[str, float]] | None = None

    def scores(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        """`metrics`, and the user's `compute_metrics` given the predictions (`logits`, else `probs` or `preds`)
        and the labels of every evaluation example."""
        out = self.metrics(rows)
        if self.compute_metrics is None:
            return out
        from transformers import EvalPrediction

        from leantrain.errors import ConfigError

        predictions = next(rows[k] for k in ("logits", "probs", "preds", "index") if k in rows)
        extra = self.compute_metrics(
            EvalPrediction(predictions=predictions, label_ids=rows.get("labels", rows["index"]))
        )
        for key, value in (extra or {}).items():
            try:
                out[str(key).removeprefix("eval_")] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"compute_metrics returned {key}={value!r}; give numbers only") from None
        return out

    def metric_for_best(self, name: str | None) -> str:
        """`--metric-for-best` as the evaluation's key (None: the task's `default_metric`), refused in one line
        when this task does not report it."""
        from leantrain.errors import ConfigError

        key = (name or self.default_metric).removeprefix("eval_")
        if key in self.metric_names or self.compute_metrics is not None:  # the user's names are known at the end
            return key
        raise ConfigError(
            f"--metric-for-best {name!r} is not an evaluation metric of this run; choose one of "
            f"{', '.join(self.metric_names)} (or add it with --metrics)"
        )

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        """The end-of-run table's evaluation rows."""
        return [(f"eval {k.replace('_', ' ')}", f"{v:.4f}") for k, v in metrics.items()]

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        """Facts about the training data that a resumed run must match (same examples, same labels)."""
        import zlib

        if getattr(data.train, "streaming", False):  # a stream is known by its source, not its rows
            return {"train_source": data.train.fingerprint(), "label_names": list(data.label_names)}
        lengths = np.ascontiguousarray(data.train.lengths, dtype=np.int64).tobytes()
        labels = np.ascontiguousarray(data.train.labels, dtype=np.int64).tobytes()
        return {
            "train_examples": len(data.train),
            "label_names": list(data.label_names),
            "data_fingerprint": zlib.crc32(labels + lengths),
        }

    # -- inference: `leantrain evaluate` and `predict` ----------------------------------------------------------
    @classmethod
    def inference_defaults(cls, model_config: Any) -> dict[str, Any]:
        """Config values for scoring a model leantrain did not train (no run config to read them from)."""
        return {}

    def load_trained(self, model_path: str) -> torch.nn.Module:
        """The model a run published (or any model folder this task can load), in evaluation mode."""
        import transformers

        from leantrain.errors import ModelError
        from leantrain.model import loading

        try:
            model = getattr(transformers, self.auto_model).from_pretrained(
                model_path, trust_remote_code=getattr(self.cfg, "trust_remote_code", False), **loading.PRETRAINED
            )
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"{model_path}: cannot load as a {self.name} model ({str(exc).splitlines()[0][:160]})"
            ) from None
        return model.eval()

    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        """The config's `eval_data` as labelled evaluation examples (`TaskData.eval`), prepared as training prepares
        them, their labels those of the trained model (`model_config`); `facts` says what `evaluate` reports."""
        from leantrain.errors import ConfigError

        raise ConfigError(f"leantrain evaluate does not score {self.name} models yet")

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        """What `evaluate` reports beside `scores`, and a run's final evaluation in evaluation.json and report.html:
        a per-class table and confusion matrix, counts."""
        return dict(data.facts)

    def prediction_data(
        self, model_path: str, model_config: Any, inputs: PredictionInputs
    ) -> tuple[TaskData, list[dict[str, Any]]]:
        """The inputs (`inputs`, or the config's `eval_data` table) as examples (`TaskData.eval`), and what each
        prediction row shows of its input (its text, its file), in input order."""
        from leantrain.errors import ConfigError

        raise ConfigError(f"leantrain predict does not predict with {self.name} models yet")

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One output row per input, in input order, from the evaluation rows (`eval_rows`, gathered)."""
        raise NotImplementedError

    def predict(
        self,
        model: torch.nn.Module,
        data: TaskData,
        shown: list[dict[str, Any]],
        rows_of: Callable[[], dict[str, np.ndarray]],
        inputs: PredictionInputs,
    ) -> list[dict[str, Any]]:
        """`predict`'s rows: by default `prediction_rows` of one evaluation pass (`rows_of()`); a generating task
        generates instead."""
        return self.prediction_rows(rows_of(), shown)


def same_logits(model: torch.nn.Module, whole: Callable[[], torch.Tensor], cut: Callable[[], torch.Tensor]) -> bool:
    """Whether a task's shortcut keeps the model's logits: `cut()` against `whole()`, both in evaluation mode without
    gradients, equal up to rounding. A model that fails either way does not take the shortcut."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full, chosen = whole(), cut()
    except (RuntimeError, ValueError, IndexError, TypeError, AttributeError):
        return False
    finally:
        model.train(was_training)
    scale = float(full.abs().max()) + 1.0
    return chosen.shape == full.shape and float((chosen - full).abs().max()) <= 1e-4 * scale
