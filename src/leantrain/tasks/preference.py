"""Preference tuning of a causal LM on pairs: `--task dpo` with `--preference-loss` sigmoid (DPO), ipo, hinge,
robust (label-smoothed DPO), simpo and orpo (reference-free); and what KTO shares with it (`PolicyTask`).

Each pair's chosen and rejected sequences go through the model in one forward (`tasks.policy.sequence_batch`):
packed into one row with restarting position ids where the attention keeps them apart (checked before training,
as packing is for causal LMs), else as two padded rows of one batch. Their log-probabilities are summed over the
completion's tokens only (`tasks.policy.CompletionLogps`); the reference's come from the model with its adapters
disabled (--lora), from a frozen copy, or precomputed once before training (--precompute-reference, cached like the
tokenized data). The loss is summed over pairs; the trainer divides by the pairs of the whole optimizer step, so
accumulation and N processes are exact. Training and evaluation log what TRL's DPOTrainer logs, by its names:
rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.data.split import beyond_limit
from leantrain.errors import ConfigError, DataError
from leantrain.tasks import policy
from leantrain.tasks.base import TaskData, TrainingContext
from leantrain.tasks.causal_lm import CausalLM
from leantrain.telemetry.console import counted

REFERENCE_FREE = ("simpo", "orpo")
#: the per-pair metrics logged in training and evaluation, TRL's names
PAIR_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- the losses, as formulas of the log-probabilities ----------------------------------------------------------
def pair_losses(
    kind: str,
    policy_logps: torch.Tensor,
    reference_logps: torch.Tensor | None,
    tokens: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    sft_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's loss (pairs,) and its rewards (pairs, 2: chosen, rejected), from the summed log-probabilities of
    the completions (pairs, 2) under the policy and the reference (None for simpo and orpo) and their token counts.

    sigmoid  -log σ(β Δ), Δ = (π_c - ρ_c) - (π_r - ρ_r): DPO
    hinge    max(0, 1 - β Δ): SLiC
    ipo      ((π_c - ρ_c)/n_c - (π_r - ρ_r)/n_r - 1/(2β))²: IPO on per-token log-ratios (as TRL)
    robust   (-(1-ε) log σ(β Δ) + ε log σ(-β Δ)) / (1 - 2ε): DPO robust to a share ε of flipped labels
    simpo    -log σ(β (π_c/n_c - π_r/n_r) - γ): SimPO, reference-free
    orpo     -π_c/n_c - β log σ(log odds(π_c/n_c) - log odds(π_r/n_r)), odds(p) = p/(1-p): ORPO

    `sft_weight` w adds w (-π_c/n_c) to any of them (RPO): each pair's own mean NLL of its chosen tokens, where
    TRL's "sft" term is the batch's token mean (equal when the chosen completions have equal lengths), so that
    accumulation and processes stay exact.
    """
    losses, rewards = _pair_losses(kind, policy_logps, reference_logps, tokens, beta, label_smoothing, simpo_gamma)
    if sft_weight:
        losses = losses - sft_weight * policy_logps[:, 0] / tokens[:, 0].float().clamp(min=1)
    return losses, rewards


def _pair_losses(
    kind: str,
    policy_logps: torch.Tensor,
    reference_logps: torch.Tensor | None,
    tokens: torch.Tensor,
    beta: float,
    label_smoothing: float,
    simpo_gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = tokens.float().clamp(min=1)
    if kind in REFERENCE_FREE:
        mean = policy_logps / tokens
        rewards = beta * mean
        chosen, rejected = mean[:, 0], mean[:, 1]
        if kind == "simpo":
            return -F.logsigmoid(beta * (chosen - rejected) - simpo_gamma), rewards
        # log(p / (1 - p)) = log p - log(1 - e^log p); expm1 keeps it exact near p = 1
        log_odds = (chosen - rejected) - (torch.log(-torch.expm1(chosen)) - torch.log(-torch.expm1(rejected)))
        return -chosen - beta * F.logsigmoid(log_odds), rewards
    assert reference_logps is not None
    ratios = policy_logps - reference_logps
    rewards = beta * ratios
    delta = ratios[:, 0] - ratios[:, 1]
    if kind == "sigmoid":
        return -F.logsigmoid(beta * delta), rewards
    if kind == "hinge":
        return torch.relu(1 - beta * delta), rewards
    if kind == "ipo":
        per_token = ratios / tokens
        return (per_token[:, 0] - per_token[:, 1] - 1 / (2 * beta)) ** 2, rewards
    if kind == "robust":
        eps = label_smoothing
        return (-(1 - eps) * F.logsigmoid(beta * delta) + eps * F.logsigmoid(-beta * delta)) / (1 - 2 * eps), rewards
    raise ConfigError(f"--preference-loss {kind}: unknown")


@dataclass
class PolicyOutputs:
    """What `forward` computed for a batch: the policy's log-probabilities of its sequences and the reference's."""

    policy: policy.SequenceLogps
    #: (sequences,), None for a reference-free loss
    reference: torch.Tensor | None
    #: the batch's sequences aside (KTO's mismatched completions), and the reference's of them
    aside: Any = None


class PolicyTask(CausalLM):
    """A causal LM tuned on examples of a prompt and completions (pairs, or single judgements): data, the one
    forward of each example's sequences, the reference in its three forms, generation for `predict`."""

    #: not inferred from a model's config: a causal LM is fine-tuned with --task causal-lm unless told otherwise
    model_mapping: ClassVar[str] = ""
    architectures: ClassVar[tuple[str, ...]] = ()
    streams: ClassVar[bool] = False
    plain_folder: ClassVar[str] = "dataset"  # its rows are read as a table, never as text files
    #: "pairs" (prompt, chosen, rejected) or "judgements" (prompt, completion, label)
    data_kind: ClassVar[str] = "pairs"
    #: completions batched aside from the main ones (KTO's mismatched completions)
    aside: ClassVar[int] = 0
    metric_names: tuple[str, ...] = ("loss", *PAIR_METRICS)
    default_metric: ClassVar[str] = "loss"
    uses_reference: ClassVar[bool] = True
    dropout_off: ClassVar[bool] = True

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.reference: policy.Reference = policy.NoReference()
        self.logps: policy.CompletionLogps | None = None

    @property
    def reference_free(self) -> bool:
        return False

    @classmethod
    def planned_reference(cls, cfg: Any) -> tuple[float, bool]:
        """A live reference runs every sequence once more (the model with its adapters off, or a frozen copy held
        in the run's precision); a precomputed one nothing; KTO's baseline adds its mismatched completions (the
        policy's and, live, the reference's)."""
        if cls.name == "dpo" and cfg.preference_loss in REFERENCE_FREE:
            return 0.0, False
        aside = 1.0 if cls.aside else 0.0
        if cfg.precompute_reference:
            return aside, False
        return 1.0 + 2 * aside, not cfg.lora

    @classmethod
    def for_config(cls, cfg: Any) -> PolicyTask:
        task = super().for_config(cfg)
        assert isinstance(task, PolicyTask)
        if cfg.precompute_reference and task.reference_free:
            what = f"--preference-loss {cfg.preference_loss}" if cls.name == "dpo" else f"the {cls.name} task"
            raise ConfigError(f"--precompute-reference: {what} has no reference model; leave it out")
        if getattr(cfg, "streaming", False):
            raise ConfigError(f"--streaming: the {cls.name} task reads its data whole; leave it out")
        return task

    # -- data ----------------------------------------------------------------------------------------------------
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import single_source
        from leantrain.data.prepare import Examples
        from leantrain.data.sources import resolve_data_path
        from leantrain.model import presets

        cfg = self.cfg
        single_source(cfg, self.name)  # pairs and judgements have no mixture reader (dedupe, shares, per-source loss)
        if presets.is_preset(model_path):
            raise ConfigError(
                f"--model {model_path}: preference tuning starts from a trained model; instruction-tune it first "
                "(--task causal-lm) and give that run's folder"
            )
        tokenizer = self._tokenizer(model_path, Path(cfg.cache_dir))
        train, notes = self.examples(resolve_data_path(cfg.data), "train", tokenizer)
        if cfg.eval_data:
            held, eval_notes = self.examples(cfg.eval_data, "eval", tokenizer)
            notes += eval_notes
        else:
            if len(train) < 2:
                raise DataError(f"{cfg.data}: only {len(train)} usable row; need two to hold one out (or --eval-data)")
            order = np.random.default_rng(cfg.seed).permutation(len(train))
            n = max(1, round(len(train) * cfg.eval_fraction))
            held, train = train.subset(np.sort(order[:n])), train.subset(np.sort(order[n:]))
            notes.append(f"held out {counted(n, 'row')} ({cfg.eval_fraction:.0%}, seed {cfg.seed}) for evaluation")
        if cfg.limit is not None and cfg.limit < len(train):
            train = train.subset(np.sort(np.random.default_rng(cfg.seed + 1).permutation(len(train))[: cfg.limit]))
            notes.append(f"training on a random sample of {cfg.limit:,} rows (--limit)")
        elif over := beyond_limit(cfg.limit, len(train), "training rows"):
            notes.append(over)
        train, held = self.finish(train), self.finish(held)
        notes.append(f"{len(train):,} training rows, {int(train.counted.sum()):,} completion tokens counted")
        train_set, eval_set = Examples(train, self.labels_of(train)), Examples(held, self.labels_of(held))
        return TaskData(train_set, eval_set, [], tokenizer, notes)

    def examples(self, source: str, split: str, tokenizer) -> tuple[Any, list[str]]:
        """The tokenized examples of `source`, cut to --max-length (rows left with nothing to learn skipped and
        counted); and the notes for the user."""
        from leantrain.data import preferences
        from leantrain.data.sources import read_options

        cfg = self.cfg
        role = "train" if split == "train" else "eval"
        found, report, hit = preferences.load_sequences(
            source, tokenizer, Path(cfg.cache_dir), split, read_options(cfg, role), self.data_kind
        )
        kept, skipped = preferences.cut_to_length(found, cfg.max_length, pairs=self.data_kind == "pairs")
        notes = [f"{report.summary()}; {'tokenized data loaded from cache' if hit else 'tokenized and cached'}"]
        if skipped["same"]:
            notes.append(f"skipped {skipped['same']:,} rows whose chosen and rejected are the same (in --max-length)")
        if skipped["cut away"]:
            notes.append(
                f"skipped {skipped['cut away']:,} rows whose completion lies wholly beyond --max-length "
                f"{cfg.max_length} (the prompt fills it)"
            )
        if len(kept) == 0:
            why = "chosen equals rejected in every row" if skipped["same"] == len(found) else "no row is left to learn"
            raise DataError(
                f"{source}: {why} ({skipped['same']:,} with chosen equal to rejected, {skipped['cut away']:,} cut away "
                f"by --max-length {cfg.max_length}); give pairs that differ, or raise --max-length"
            )
        return kept, notes

    def finish(self, examples: Any) -> Any:
        """The examples as the task batches them (KTO adds each row's mismatched completion)."""
        return examples

    def labels_of(self, examples: Any) -> np.ndarray:
        return np.zeros(len(examples), dtype=np.int64)

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.batching import length_buckets, static_shapes_on
        from leantrain.data.preferences import SequencesCollator

        # --static-shapes: a packed row holds an example's sequences, each up to --max-length
        longest = self.cfg.max_length * (2 if self.packing else 1)
        buckets = length_buckets(longest) if train and static_shapes_on(self.cfg) else []
        return SequencesCollator(data.processor.pad_token_id, packing=self.packing, aside=self.aside, buckets=buckets)

    def loss_units(self, data: TaskData) -> np.ndarray:
        return np.ones(len(data.train))  # one unit a row: the loss is the mean over the step's pairs (or judgements)

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        features = data.train.features
        return {"train_examples": len(data.train), "label_names": [], "data_fingerprint": features.fingerprint()}

    # -- the model and its reference -------------------------------------------------------------------------------
    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        """The causal LM, its dropout off (as TRL's trainers turn it off): the policy's log-probabilities are then
        its reference's at the start, and the KL baseline is not noise."""
        model = super().build_model(model_path, data)
        self._turn_dropout_off(model)
        return model

    @classmethod
    def _turn_dropout_off(cls, model: torch.nn.Module) -> None:
        """Every dropout the model runs at 0 where the task says so (`dropout_off`, which the planner reads too):
        its modules and its attention's float rates; its config keeps the model's own, as TRL's `disable_dropout`."""
        if cls.dropout_off:
            from leantrain.model.dropout import set_module_rates

            set_module_rates(model, 0.0)

    def check_model(self, model: torch.nn.Module) -> None:
        if self.packing:  # the chosen and rejected sequences of a pair share a row
            from leantrain.tasks.causal_lm import check_packing_separates

            check_packing_separates(model)
        if self.logps is None:  # `leantrain evaluate`: before_training never ran
            self.logps = policy.CompletionLogps(model, compiled=self.cfg.compile)
        if isinstance(self.reference, policy.FrozenCopy):
            self.reference.model.to(next(model.parameters()).device)

    def before_training(self, model: torch.nn.Module, data: TaskData, context: TrainingContext) -> None:
        """The policy's log-probabilities as the model now runs (its adapters added, its device), and the reference:
        none (a reference-free loss), precomputed over `data` (--precompute-reference), the model with its
        adapters disabled (--lora) or a frozen copy in the run's precision."""
        started = time.perf_counter()
        cfg = self.cfg
        self.logps = policy.CompletionLogps(model, compiled=cfg.compile)
        other = self._other_reference(model, context) if not self.reference_free else None
        if self.reference_free:
            self.reference = policy.NoReference()
        elif cfg.precompute_reference:
            initial = other or (policy.AdaptersOff(self.logps) if cfg.lora else policy.Unchanged(self.logps))
            for name, examples in (("training", data.train), ("evaluation", data.eval)):
                self._precompute(initial, model, examples, context, name, data.processor)
            self.reference = policy.Precomputed()  # (another model's copy is dropped here)
        elif other is not None:
            self.reference = other
        elif cfg.lora:
            self.reference = policy.AdaptersOff(self.logps)
        else:
            self.reference = policy.FrozenCopy(model, DTYPES[context.precision], compiled=cfg.compile)
        self.reference_seconds = time.perf_counter() - started
        context.say(self.reference.describe())

    def frozen_models(self) -> list[tuple[torch.nn.Module, Any]]:
        reference = self.reference
        return [(reference.model, reference.autocast)] if isinstance(reference, policy.FrozenCopy) else []

    def _other_reference(self, model: torch.nn.Module, context: TrainingContext) -> policy.FrozenCopy | None:
        """--reference-model, when it names another model than --model: loaded, frozen, on the policy's device."""
        from leantrain.model import loading
        from leantrain.telemetry.flops import unwrap

        cfg = self.cfg
        if cfg.reference_model is None or cfg.reference_model == cfg.model:
            return None
        name = loading.resolve_model(cfg.reference_model)
        other = loading.load_for_causal_lm(name, trust_remote_code=cfg.trust_remote_code)
        vocab, own = int(other.config.vocab_size), int(getattr(unwrap(model).config, "vocab_size", 0))
        if vocab != own:
            raise ConfigError(
                f"--reference-model {cfg.reference_model}: its vocabulary ({vocab:,}) is not the model's ({own:,}); "
                "give a reference with the same tokenizer"
            )
        other.to(next(model.parameters()).device)
        return policy.FrozenCopy(other, DTYPES[context.precision], compiled=cfg.compile)

    def training_facts(self) -> dict[str, Any]:
        """The reference's form, its weights' bytes held beside the policy (a frozen copy's; none otherwise) and the
        seconds it took to set up (a precomputation's forward passes over the data)."""
        from leantrain.telemetry.memory import tensor_bytes

        held = self.reference.model.parameters() if isinstance(self.reference, policy.FrozenCopy) else []
        return {
            "reference": self.reference.kind,
            "reference_bytes": tensor_bytes(held),
            "reference_seconds": getattr(self, "reference_seconds", None),
        }

    def _precompute(
        self, initial: policy.Reference, model, examples, context: TrainingContext, name: str, processor
    ) -> None:
        """The reference's log-probabilities of every sequence of `examples`, into `examples.features.values`, from
        the cache when this job computed them before; else computed, each process a share of the rows."""
        from leantrain import parallel
        from leantrain.data import preferences

        path = Path(self.cfg.cache_dir) / "reference" / f"{self._reference_key(examples.features, model, context)}.npz"
        completions = examples.features.parts - 1
        cached = preferences.load_arrays(path) if context.accelerator.is_main_process else None
        found = cached[0]["reference"] if cached is not None else None
        if found is not None and found.shape != (len(examples), completions):
            found = None
        found = parallel.broadcast_from_main(found)
        if found is None:
            found = self._reference_logps(initial, model, examples, context, processor)
            if context.accelerator.is_main_process:
                preferences.store_arrays(path, {"reference": found}, {"rows": len(examples)})
        examples.features.values["reference"] = found
        source = "loaded from the cache" if cached is not None and found is not None else "computed and cached"
        context.say(f"reference log-probabilities of {len(examples):,} {name} rows {source}")

    def _reference_key(self, features, model, context: TrainingContext) -> str:
        """Keyed like the tokenization cache: the rows' tokens, the model's files (and seed, when it starts at
        random), the precision and attention kernel it runs with."""
        from leantrain.data.tokenize import cache_key, source_fingerprint
        from leantrain.model import loading
        from leantrain.telemetry.flops import unwrap

        name = loading.resolve_model(self.cfg.reference_model or self.cfg.model)
        random_start = loading.has_weights(name) is False
        return cache_key(
            kind="reference-logps",
            rows=features.fingerprint(),
            model=source_fingerprint(name),
            seed=self.cfg.seed if random_start else None,
            precision=context.precision,
            attention=getattr(unwrap(model).config, "_attn_implementation", None),
            packing=self.packing,
        )

    def _reference_logps(
        self, initial: policy.Reference, model, examples, context: TrainingContext, processor
    ) -> np.ndarray:
        """(rows, completions): this process computes the rows i with i % processes == rank; all are gathered."""
        from leantrain.data.batching import ExamplesDataset, eval_batches

        acc = context.accelerator
        mine = np.arange(acc.process_index, len(examples), acc.num_processes)
        collate = self.collator(TaskData(None, examples, [], processor), train=False)
        dataset = ExamplesDataset(examples)
        batch_size = self.cfg.eval_batch_size or 2 * self.cfg.batch_size_or_default()
        index, values = [], []
        for rows in eval_batches(examples.lengths[mine], batch_size):
            batch = _to(collate([dataset[int(mine[r])] for r in rows]), acc.device)
            with context.autocast():
                value = [initial.logps(model, batch)]
                if "aside" in batch:
                    value.append(initial.logps(model, batch["aside"]))
            n = len(rows)
            values.append(torch.cat([v.reshape(n, -1) for v in value], 1).double())
            index.append(batch["index"])
        local_index = torch.cat(index) if index else torch.zeros(0, dtype=torch.long, device=acc.device)
        local = torch.cat(values) if values else torch.zeros(0, examples.features.parts - 1, device=acc.device)
        if acc.num_processes > 1:
            local_index, local = acc.pad_across_processes((local_index, local.double()), dim=0, pad_index=-1)
            local_index, local = acc.gather((local_index.contiguous(), local.contiguous()))
        keep = local_index >= 0
        out = np.zeros((len(examples), examples.features.parts - 1))
        out[local_index[keep].cpu().numpy()] = local[keep].cpu().numpy()
        return out

    # -- a step ----------------------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        assert self.logps is not None  # set in before_training (training) or check_model (evaluate)
        logps = self.logps(model, batch)
        reference = None if self.reference_free else self.reference.logps(model, batch)
        return PolicyOutputs(logps, reference)

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return self.logps.rows_of(batch) if self.logps is not None else None

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.telemetry.flops import row_flops, unwrap

        return row_flops(unwrap(model).get_output_embeddings().parameters())

    # -- inference ---------------------------------------------------------------------------------------------------
    def load_trained(self, model_path: str) -> torch.nn.Module:
        """The tuned model, and its reference to score pairs against: the run's --reference-model, else the model it
        was tuned from (evaluate sets it from the run's config), loaded anew."""
        model = super().load_trained(model_path)
        if not self.reference_free:
            from leantrain import parallel
            from leantrain.model import loading

            parallel.seed_everything(self.cfg.seed)  # a base that starts at random starts as the run's did
            name = loading.resolve_model(self.cfg.reference_model or self.cfg.model)
            base = loading.load_for_causal_lm(name, trust_remote_code=self.cfg.trust_remote_code)
            self.reference = policy.FrozenCopy(base, torch.float32)
        return model

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        return dict(data.facts)

    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.prepare import Examples

        tokenizer = self._tokenizer(model_path, Path(self.cfg.cache_dir))
        rows, _ = self.examples(self.cfg.eval_data, "eval", tokenizer)
        rows = self.finish(rows)
        return TaskData(None, Examples(rows, self.labels_of(rows)), [], tokenizer, facts={"examples": len(rows)})

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        """--text prompts, else the prompts of the table's rows (text or chats), for the model to complete."""
        if inputs.texts is not None or inputs.files is not None:
            return super().prediction_data(model_path, model_config, inputs)
        from leantrain.data import preferences
        from leantrain.data.instructions import as_turn
        from leantrain.data.sources import read_options, read_table
        from leantrain.model import loading

        source = self.cfg.eval_data
        df, _ = read_table(source, split="eval", options=read_options(self.cfg, "eval"))
        columns = {str(c).strip().lower(): c for c in df.columns}
        if self.data_kind == "pairs" and {"chosen", "rejected"} <= columns.keys():
            prompts = [p for p, _, _ in preferences.pair_turns(df, source)]  # as training reads them (chats too)
        elif "prompt" in columns:  # prompts alone serve: no completion or label is needed to generate
            prompts = [as_turn(p, source, "prompt", i) for i, p in enumerate(df[columns["prompt"]])]
        else:
            pairs = ", or pairs of whole chats in 'chosen' and 'rejected'" if self.data_kind == "pairs" else ""
            raise DataError(
                f"{source}: no 'prompt' column to complete (columns: {', '.join(map(repr, map(str, df.columns)))}); "
                f"give the prompts in a 'prompt' column{pairs}"
            )
        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        return TaskData(None, None, [], tokenizer), [{"prompt": p} for p in prompts]


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: _to(v, device) if isinstance(v, dict) else v.to(device) for k, v in batch.items()}


class DPO(PolicyTask):
    """Direct preference optimisation and its family on prompt / chosen / rejected pairs (see the module doc)."""

    name: ClassVar[str] = "dpo"
    aliases: ClassVar[tuple[str, ...]] = ()

    @property
    def reference_free(self) -> bool:
        return self.cfg.preference_loss in REFERENCE_FREE

    @classmethod
    def for_config(cls, cfg: Any) -> PolicyTask:
        # each of these settings is read by one loss only: set beside another, it would be ignored without a word
        loss = cfg.preference_loss
        if cfg.label_smoothing and loss != "robust":
            raise ConfigError(
                f"--label-smoothing: --preference-loss {loss} does not read it; for DPO robust to a share of flipped "
                "preferences give --preference-loss robust with it, or leave it out"
            )
        gamma = next(f.default for f in fields(cfg) if f.name == "simpo_gamma")
        if cfg.simpo_gamma != gamma and loss != "simpo":
            raise ConfigError(f"--simpo-gamma: only --preference-loss simpo reads it, not {loss}; leave it out")
        return super().for_config(cfg)

    def pairs(self, outputs: PolicyOutputs) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(pairs, 2) policy and reference log-probabilities and completion tokens: chosen, rejected."""
        reference = None if outputs.reference is None else outputs.reference.reshape(-1, 2)
        return outputs.policy.total.reshape(-1, 2), reference, outputs.policy.tokens.reshape(-1, 2)

    def losses(self, outputs: PolicyOutputs) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logps, reference, tokens = self.pairs(outputs)
        return pair_losses(
            cfg.preference_loss, logps, reference, tokens, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma,
            cfg.sft_weight,
        )  # fmt: skip

    def loss_sum(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> torch.Tensor:
        return self.losses(outputs)[0].sum()

    def _pair_rows(self, outputs: PolicyOutputs) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            losses, rewards = self.losses(outputs)
            logps = self.pairs(outputs)[0]
            return {
                "loss": losses.float(),
                "rewards/chosen": rewards[:, 0],
                "rewards/rejected": rewards[:, 1],
                "rewards/accuracies": (rewards[:, 0] > rewards[:, 1]).float(),
                "rewards/margins": rewards[:, 0] - rewards[:, 1],
                "logps/chosen": logps[:, 0],
                "logps/rejected": logps[:, 1],
            }

    def train_sums(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        rows = self._pair_rows(outputs)
        return {**{k: rows[k].sum() for k in PAIR_METRICS}, "pairs": torch.tensor(float(len(rows["loss"])))}

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        pairs = max(sums["pairs"], 1.0)
        return {k: sums[k] / pairs for k in PAIR_METRICS}

    def eval_rows(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self._pair_rows(outputs)

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        return {k: float(np.mean(rows[k])) for k in ("loss", *PAIR_METRICS)}

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        return [
            ("eval loss (per pair)", f"{metrics['loss']:.4f}"),
            ("eval reward accuracy", f"{metrics['rewards/accuracies']:.4f}"),
            ("eval reward margin", f"{metrics['rewards/margins']:.4f}"),
        ]
