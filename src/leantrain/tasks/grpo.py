"""Online reinforcement learning from rewards that can be checked: GRPO, and RLOO's leave-one-out baseline.

Training rows are prompts (text, or chats rendered with the model's chat template). Each optimizer step the task
makes its own examples from the step's prompts (`step_examples`, timed as generation): `--num-generations`
completions of each, sampled with the policy's own weights (`model.generation`: batched, a KV cache, inference
mode, no dropout; with LoRA the adapters on), each prompt's from its own seed (seed, generation, prompt) so the
examples of a step never depend on how it is split and a resumed run samples them again. The completions are
scored (`tasks.rewards`: Python functions, built-in checkers), each prompt's group of rewards turned into
advantages (GRPO: (r - mean) / (std + 1e-4); RLOO: r minus the mean of the others), and the loss is the clipped
policy-gradient loss over the completions' tokens (prompt tokens never count), with a KL penalty to the reference
model at `--kl-beta` (the k3 estimator; 0 holds no reference):

    loss per token = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A) + beta * ratio * (exp(d) - d - 1)

where d = ref - logp and ratio = exp(logp - logp at generation): 1 in value with one iteration per generation,
its gradient that of logp; the KL weighted by it is TRL's default (DeepSeek-V3.2's unbiased estimate). The loss is
summed over a micro-batch's completion tokens, which are its units, so the trainer divides by the completion tokens
of the whole optimizer step across micro-batches and processes (TRL's loss_type "dapo", its default).
`--iterations-per-generation` reuses a step's generations for that many optimizer steps (the sampler repeats each
global batch of prompts), the ratio then against the log-probabilities kept from generation; what a resumed run
needs of them is saved in the checkpoint (`training_state`). Log-probabilities are those of the sampling
distribution, logits / --temperature, as TRL computes them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from leantrain.data.batching import GlobalBatchSampler, slot_fields
from leantrain.data.prepare import Examples
from leantrain.data.split import beyond_limit
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.base import Task, TaskData, TrainingContext
from leantrain.telemetry.console import counted

ADVANTAGES = ("grpo", "rloo")
#: added to a group's standard deviation before dividing by it (TRL's, so that equal rewards give 0, not 0/0)
STD_EPSILON = 1e-4


# -- advantages -------------------------------------------------------------------------------------------------------
def advantages(rewards: torch.Tensor, kind: str = "grpo") -> torch.Tensor:
    """(groups, completions) rewards -> advantages. grpo: each reward less its group's mean, over the group's standard
    deviation (Bessel's, as TRL) + 1e-4; rloo: each reward less the mean of the group's other rewards."""
    r = rewards.double()
    if kind == "grpo":
        return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + STD_EPSILON)).to(rewards.dtype)
    if kind == "rloo":
        baseline = (r.sum(1, keepdim=True) - r) / (r.shape[1] - 1)
        return (r - baseline).to(rewards.dtype)
    raise ValueError(f"unknown advantage {kind!r}")


def policy_loss(
    logps: torch.Tensor,
    advantage: torch.Tensor,
    old: torch.Tensor | None,
    reference: torch.Tensor | None,
    clip: tuple[float, float],
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per counted token: the clipped policy-gradient loss, plus beta times the KL to the reference (the k3 estimator
    times the ratio, as TRL's default `use_bias_correction_kl`: an estimate of KL(policy || reference) from tokens
    sampled at generation, whose gradient is the KL's even where the ratio is 1). `old`: the tokens'
    log-probabilities at generation (None: these, detached). Returns the per-token losses and what is logged of them
    per token (kl, clipped-low/high/region as 0/1)."""
    ratio = torch.exp(logps - (logps.detach() if old is None else old))
    clipped = torch.clamp(ratio, 1 - clip[0], 1 + clip[1])
    per_token = -torch.min(ratio * advantage, clipped * advantage)
    low = ((ratio < 1 - clip[0]) & (advantage < 0)).float()
    high = ((ratio > 1 + clip[1]) & (advantage > 0)).float()
    logged = {"clip_low": low, "clip_high": high, "clip_region": torch.maximum(low, high)}
    if beta:
        assert reference is not None
        delta = reference - logps
        kl = (torch.exp(delta) - delta - 1) * ratio  # weighted as sampled: the unbiased reverse KL (and its gradient)
        per_token = per_token + beta * kl
        logged["kl"] = kl.detach()
    return per_token, logged


def generation_seed(seed: int, generation: int, prompt: int) -> int:
    """The seed of one prompt's completions at one generation: a function of the three alone."""
    return int(np.random.SeedSequence([seed, generation, prompt]).generate_state(1, np.uint64)[0]) & (2**63 - 1)


# -- prompts ----------------------------------------------------------------------------------------------------------
@dataclass
class PromptRows:
    """Prompt rows: each prompt (text or chat), its tokens, and the row's other columns (for the rewards)."""

    prompts: list[Any]
    ids: list[list[int]]
    columns: dict[str, list[Any]]

    def subset(self, rows: Sequence[int] | np.ndarray) -> PromptRows:
        rows = [int(i) for i in rows]
        cols = {k: [v[i] for i in rows] for k, v in self.columns.items()}
        return PromptRows([self.prompts[i] for i in rows], [self.ids[i] for i in rows], cols)

    def examples(self) -> PromptExamples:
        from leantrain.data.tokenize import TokenizedText

        offsets = np.zeros(len(self.ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in self.ids], out=offsets[1:])
        flat = np.concatenate([np.asarray(x, dtype=np.int32) for x in self.ids]) if self.ids else np.zeros(0, np.int32)
        return PromptExamples(TokenizedText(flat, offsets), np.arange(len(self.ids), dtype=np.int64))


class RepeatedSampler(GlobalBatchSampler):
    """Each global batch of prompts `times` times in a row: the optimizer steps that reuse one generation. A seek
    (`start_at`) counts those steps: it lands in the middle of a global batch's repeats when a run is resumed there."""

    def __init__(self, *args: Any, times: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.times, self.skip = times, 0

    def start_at(self, epoch: int, global_batch: int) -> None:
        super().start_at(epoch, global_batch // self.times)
        self.skip = global_batch % self.times  # repeats of the first global batch done already

    def _skipped(self) -> int:
        return self.skip if self.start[0] == self.epoch else 0

    def steps_per_epoch(self) -> int:
        return super().steps_per_epoch() * self.times

    def __iter__(self):
        group: list[Any] = []
        ended, skip = 0, self._skipped()
        for micro in super().__iter__():
            group.append(micro)
            ended += bool(micro[-1].step_end)
            if ended == self.num_processes:  # every process's last micro-batch of this global batch
                for _ in range(self.times - skip):
                    yield from group
                group, ended, skip = [], 0, 0

    def __len__(self) -> int:
        whole = super().__len__() * self.times
        if not self._skipped():
            return whole
        first = min(self.global_batch, len(self.lengths) - self._first_batch() * self.global_batch)
        return whole - self._skipped() * self.micro_steps(np.empty(first)) * self.num_processes


class PromptExamples(Examples):
    """Prompts to train on; with --iterations-per-generation each global batch comes `times` times."""

    times: int = 1

    def subset(self, rows: np.ndarray) -> PromptExamples:
        return PromptExamples(self.features.subset(rows), self.labels[rows])

    def batches(
        self, micro_batch: int, accumulation: int, num_processes: int, seed: int, units=None, longest_first=False
    ):
        from leantrain.data.batching import ExamplesDataset

        sampler = RepeatedSampler(
            self.lengths,
            micro_batch,
            accumulation,
            num_processes,
            seed,
            units=units,
            longest_first=longest_first,
            times=self.times,
        )
        return sampler, ExamplesDataset(self)


class PromptCollator:
    """A batch of prompts: their example ids and slots (the task reads their tokens by id), left-padded tokens."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        from leantrain.model.generation import left_padded

        ids, mask = left_padded([x["input_ids"].tolist() for x in items], self.pad_token_id, "cpu")
        return {
            "input_ids": ids,
            "attention_mask": mask,
            **slot_fields(items),
            "num_tokens": mask.sum(),
            "padded_tokens": torch.tensor(ids.numel()),
        }


# -- the task ---------------------------------------------------------------------------------------------------------
class GRPO(Task):
    name: ClassVar[str] = "grpo"
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "position_ids")
    auto_model: ClassVar[str] = "AutoModelForCausalLM"
    pipeline: ClassVar[str] = "text-generation"
    generates: ClassVar[bool] = True
    empty_prompts: ClassVar[bool] = True
    makes_examples: ClassVar[bool] = True
    shown_while_training: ClassVar[tuple[str, ...]] = ("reward",)
    default_metric: ClassVar[str] = "reward"

    def __init__(self, cfg: Any):
        from leantrain.tasks import rewards

        super().__init__(cfg)
        if not getattr(cfg, "reward", None):
            raise ConfigError(
                "--task grpo needs --reward: a built-in checker (exact-match, regex, number) or module:function"
            )
        names = []
        for spec, _ in rewards.parse(cfg.reward):  # a module that does not import is refused now, in one line
            names.append(spec.replace("-", "_") if spec in rewards.BUILT_IN else rewards.import_function(spec).__name__)
        self.metric_names = ("reward", *(f"rewards/{n}/mean" for n in names), "completions/mean_length")
        self.tables: dict[str, PromptRows] = {}
        self.rollout: dict[str, Any] | None = None  # the generation later steps reuse (--iterations-per-generation)
        self.context: TrainingContext | None = None

    @classmethod
    def for_config(cls, cfg: Any) -> Task:
        from leantrain.model import presets

        task = super().for_config(cfg)
        if cfg.num_generations < 2:
            raise ConfigError(
                f"--num-generations {cfg.num_generations}: GRPO's advantages compare each completion with the other "
                "completions of its prompt; give 2 or more (8 is usual)"
            )
        if cfg.max_completion_length >= cfg.max_length:
            raise ConfigError(
                f"--max-completion-length {cfg.max_completion_length} leaves no room for a prompt within --max-length "
                f"{cfg.max_length} (prompt and completion together); raise --max-length or lower it"
            )
        for flag, on in (("--compile", cfg.compile), ("--shard fsdp", cfg.shard != "none")):
            if on:  # each step's examples are made by sampling from the model, which these do not support yet
                raise ConfigError(f"{flag} with --task grpo is not supported yet; leave it out")
        if presets.is_preset(cfg.model):
            raise ConfigError(
                f"--task grpo tunes a model that can already answer its prompts; give a trained model (an "
                f"instruction-tuned run's model/ folder, a hub model), not {cfg.model}"
            )
        return task

    # -- data and model -----------------------------------------------------------------------------------------
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import single_source
        from leantrain.data.sources import resolve_data_path

        cfg = self.cfg
        single_source(cfg, self.name)  # prompts have no mixture reader
        # kept for evaluation: `leantrain evaluate RUN` scores the held-out prompts without training first
        tokenizer = self.tokenizer = self._tokenizer(model_path)
        train = self._read(resolve_data_path(cfg.data), "train", tokenizer)
        notes = [f"{len(train.prompts):,} training prompts read from {cfg.data}"]
        if cfg.eval_data:
            held = self._read(cfg.eval_data, "eval", tokenizer)
        else:
            if len(train.prompts) < 2:
                raise DataError(
                    f"{cfg.data}: only {len(train.prompts)} prompt; need two to hold one out (or --eval-data)"
                )
            order = np.random.default_rng(cfg.seed).permutation(len(train.prompts))
            count = max(1, round(len(order) * cfg.eval_fraction))
            held, train = train.subset(np.sort(order[:count])), train.subset(np.sort(order[count:]))
            share = f"{cfg.eval_fraction:.0%}, seed {cfg.seed}"
            notes.append(f"held out {counted(count, 'prompt')} ({share}) for evaluation")
        if cfg.limit is not None and cfg.limit < len(train.prompts):
            keep = np.random.default_rng(cfg.seed + 1).permutation(len(train.prompts))[: cfg.limit]
            train = train.subset(np.sort(keep))
            notes.append(f"training on a random sample of {cfg.limit:,} prompts (--limit)")
        elif over := beyond_limit(cfg.limit, len(train.prompts), "training prompts"):
            notes.append(over)
        train, held = self._fitting(train, "training", notes), self._fitting(held, "evaluation", notes)
        self._load_rewards(train, notes)
        self.tables = {"train": train, "eval": held}
        examples = train.examples()
        examples.times = cfg.iterations_per_generation
        return TaskData(examples, held.examples(), [], tokenizer, notes)

    def _tokenizer(self, model_path: str):
        from leantrain.data.instructions import set_chat_template
        from leantrain.model import loading

        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        if tokenizer.pad_token_id is None:  # padding is never counted: EOS serves
            tokenizer.pad_token = tokenizer.eos_token
        set_chat_template(tokenizer, self.cfg.chat_template)
        return tokenizer

    def _read(self, source: str, role: str, tokenizer) -> PromptRows:
        from leantrain.data.sources import read_options, read_table

        df, _ = read_table(source, split=role, options=read_options(self.cfg, role))
        prompts, column = prompt_turns(df, source, self.cfg.text_column)
        columns = {str(c): df[c].tolist() for c in df.columns if c != column}
        return PromptRows(prompts, encode_prompts(tokenizer, prompts), columns)

    def _fitting(self, rows: PromptRows, what: str, notes: list[str]) -> PromptRows:
        """The prompts that leave room for a whole completion within --max-length; the others skipped and counted."""
        cfg = self.cfg
        room = cfg.max_length - cfg.max_completion_length
        keep = [i for i, ids in enumerate(rows.ids) if 0 < len(ids) <= room]
        if not keep:
            raise DataError(
                f"--data: no {what} prompt fits in --max-length {cfg.max_length} minus --max-completion-length "
                f"{cfg.max_completion_length} ({room} tokens); raise --max-length or shorten the prompts"
            )
        if len(keep) < len(rows.ids):
            notes.append(
                f"skipped {len(rows.ids) - len(keep):,} {what} prompts longer than --max-length {cfg.max_length} "
                f"minus --max-completion-length {cfg.max_completion_length} ({room} tokens)"
            )
            rows = rows.subset(keep)
        return rows

    def _load_rewards(self, train: PromptRows, notes: list[str]) -> None:
        from leantrain.tasks import rewards

        cfg = self.cfg
        reference = cfg.reward_column
        if reference is None:
            reference = next((c for c in rewards.REFERENCE_COLUMNS if c in train.columns), None)
            if reference is not None and any(
                n in rewards.BUILT_IN and n != "regex" for n, _ in rewards.parse(cfg.reward)
            ):
                notes.append(f"rewards compare completions with the column '{reference}' (--reward-column)")
        elif reference not in train.columns:
            raise DataError(
                f"--reward-column {reference!r}: no such column in {cfg.data} (it has {', '.join(train.columns)})"
            )
        self.rewards = rewards.load(cfg.reward, reference, cfg.reward_pattern)
        self.weights = torch.tensor([r.weight for r in self.rewards], dtype=torch.float64)

    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        from leantrain.model import loading

        model = loading.load_for_causal_lm(model_path, None, trust_remote_code=self.cfg.trust_remote_code)
        limit = loading.max_supported_length(model.config)
        if limit is not None and self.cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {self.cfg.max_length} is beyond what {self.cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less"
            )
        return model

    @property
    def packing(self) -> bool:
        return bool(self.cfg.packing)  # off unless asked: a rollout's sequences are one a row

    def check_model(self, model: torch.nn.Module) -> None:
        from leantrain.tasks.causal_lm import check_packing_separates

        if self.packing:  # the kernel that will run must keep the sequences packed in a row apart
            check_packing_separates(model)

    def collator(self, data: TaskData, *, train: bool):
        return PromptCollator(data.processor.pad_token_id)

    def before_training(self, model: torch.nn.Module, data: TaskData, context: TrainingContext) -> None:
        from leantrain.tasks import policy
        from leantrain.telemetry.flops import unwrap

        cfg, inner = self.cfg, unwrap(model)
        self.context, self.tokenizer = context, data.processor
        self.computer = policy.CompletionLogps(inner, compiled=cfg.compile, temperature=cfg.temperature)
        self.reference: policy.Reference = policy.NoReference()
        if cfg.kl_beta:  # with LoRA the base itself (adapters off); else a frozen copy in the run's precision
            if cfg.lora:
                self.reference = policy.AdaptersOff(policy.CompletionLogps(inner, temperature=cfg.temperature))
            else:
                dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(context.precision, torch.float32)
                self.reference = policy.FrozenCopy(inner, dtype, compiled=cfg.compile)
                self.reference.computer.temperature = cfg.temperature
            context.say(self.reference.describe())
        self.sampling = self._sampling(inner, cfg.temperature, cfg.top_p)

    def _sampling(self, model: Any, temperature: float | None, top_p: float):
        from leantrain.model.generation import Sampling

        eos = {self.tokenizer.eos_token_id}
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(configured if isinstance(configured, (list, tuple)) else [configured])
        eos.discard(None)
        return Sampling(
            self.cfg.max_completion_length, tuple(sorted(eos)), self.tokenizer.pad_token_id, temperature, top_p
        )

    # -- a step: generate, score, train ---------------------------------------------------------------------------
    def step_examples(
        self, model: torch.nn.Module, batches: list[dict[str, Any]], step: int, context: TrainingContext
    ) -> list[dict[str, Any]]:
        """The step's completions of its prompts, scored, as sequence batches (one per micro-batch of prompts); with
        --iterations-per-generation the first step of a generation's generates, the others reuse it."""
        generation, iteration = divmod(step, self.cfg.iterations_per_generation)
        if iteration:
            rollout = self.rollout
            if rollout is None or rollout["generation"] != generation:
                raise RuntimeError(f"step {step + 1} reuses generation {generation}, which this process does not hold")
            device = batches[0]["index"].device
            return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in rollout["batches"]]
        made = [self._rollout(model, batch, generation, context.generation_attention) for batch in batches]
        if self.cfg.iterations_per_generation > 1:
            self.rollout = {"generation": generation, "batches": made}
        return made

    def _rollout(
        self, model: torch.nn.Module, batch: dict[str, Any], generation: int, kernel: str | None
    ) -> dict[str, Any]:
        """One micro-batch of prompts' completions, sampled with attention `kernel` (the evaluations': no backward
        pass), scored, with what the loss needs of them (log-probabilities in the training kernel)."""
        from leantrain.model import attention
        from leantrain.model.generation import sample
        from leantrain.tasks import policy
        from leantrain.telemetry.flops import unwrap

        cfg, table, group = self.cfg, self.tables["train"], self.cfg.num_generations
        index = batch["index"].tolist()
        prompts = [table.ids[i] for i in index]
        seeds = [generation_seed(cfg.seed, generation, i) for i in index]
        with attention.running(unwrap(model), kernel):
            completions = sample(model, prompts, group, self.sampling, seeds)
        scores = self._score(table, index, completions, group)
        total = torch.from_numpy(scores) @ self.weights
        advantage = advantages(total.view(len(index), group).float(), cfg.advantage).reshape(-1)
        device = batch["index"].device
        made = self._sequences([(prompts[k // group], c) for k, c in enumerate(completions)], device)
        tokens = torch.tensor([len(c) for c in completions], dtype=torch.float32)
        made.update(
            index=torch.tensor(index, device=device).repeat_interleave(group),
            advantages=advantage.to(device),
            units=tokens.sum().to(device),
            step_end=batch["step_end"],
            rollout=rollout_sums(
                torch.from_numpy(scores),
                total,
                tokens,
                group,
                self.sampling.max_new_tokens,
                completions,
                self.sampling.eos_token_ids,
            ).to(device),
        )
        if cfg.iterations_per_generation > 1:  # the tokens' log-probabilities now, for the later steps' ratio
            with policy.evaluating(unwrap(model)):
                made["old_logps"] = self.computer(unwrap(model), made).per_token.float()
        if cfg.kl_beta:
            made["ref_logps"] = self.reference.token_logps(model, made).float()
        return made

    def _sequences(self, sequences: list[tuple[list[int], list[int]]], device) -> dict[str, Any]:
        """Prompt + completion sequences as one batch: packed into rows of --max-length (or one a row, padded)."""
        from leantrain.tasks import policy

        rows = pack_rows([len(p) + len(c) for p, c in sequences], self.cfg.max_length) if self.packing else None
        batch = policy.sequence_batch(sequences, self.tokenizer.pad_token_id, rows=rows)  # type: ignore[arg-type]
        lengths = sum(len(p) + len(c) for p, c in sequences)
        batch = {k: v.to(device) for k, v in batch.items()}
        batch.update(num_tokens=torch.tensor(lengths), padded_tokens=torch.tensor(batch["input_ids"].numel()))
        return batch

    def _score(self, table: PromptRows, index: list[int], completions: list[list[int]], group: int) -> np.ndarray:
        """(completions, rewards): every reward function's score of each completion. A reward that breaks the rules
        stops every process (each says why, or that another did)."""
        from leantrain.tasks import rewards

        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        prompts = [table.prompts[i] for i in index for _ in range(group)]
        shown = [t if isinstance(p, str) else [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)]
        columns = {k: [v[i] for i in index for _ in range(group)] for k, v in table.columns.items()}
        error: ConfigError | None = None
        try:
            scores = rewards.score(self.rewards, prompts, shown, completions, columns)
        except ConfigError as exc:
            error, scores = exc, np.zeros((len(completions), len(self.rewards)))
        self._agree(error)
        return scores

    def _agree(self, error: Exception | None) -> None:
        """Raise `error` on its process and a pointer to it on the others, all at the same point."""
        accelerator = self.context.accelerator if self.context is not None else None
        failed = error is not None
        if accelerator is not None and accelerator.num_processes > 1:
            flag = torch.tensor(float(failed), device=accelerator.device)
            failed = float(accelerator.reduce(flag, reduction="sum")) > 0
        if error is not None:
            raise error
        if failed:
            raise ConfigError("a reward function failed on another process; its message above says why")

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """Training: the policy's log-probabilities of the completions' tokens (`policy.CompletionLogps`, the head
        only where a token counts). Evaluation (a batch of prompts): one greedy completion of each."""
        if "sequence_ids" in batch:
            return self.computer(model, batch)
        return self._greedy(model, batch)

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return self.computer.rows_of(batch) if "sequence_ids" in batch else None

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.telemetry.flops import row_flops, unwrap

        computer = getattr(self, "computer", None)
        if computer is None or computer.mode == "full":
            return 0.0
        return row_flops(unwrap(model).get_output_embeddings().parameters())

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        per_token, _ = self._per_token(outputs.per_token, outputs.sequence, batch)
        return per_token.sum()

    def _per_token(self, logps: torch.Tensor, sequence: torch.Tensor, batch: dict[str, Any]):
        cfg = self.cfg
        clip = (cfg.clip_epsilon, cfg.clip_epsilon_high if cfg.clip_epsilon_high is not None else cfg.clip_epsilon)
        advantage = batch["advantages"][sequence]
        return policy_loss(logps, advantage, batch.get("old_logps"), batch.get("ref_logps"), clip, cfg.kl_beta)

    def train_sums(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        _, logged = self._per_token(outputs.per_token.detach(), outputs.sequence, batch)
        sums = {k: v.sum() for k, v in logged.items()}
        sums["tokens"] = torch.tensor(float(len(outputs.per_token)), device=outputs.per_token.device)
        for k, v in zip(self._rollout_keys(), batch["rollout"]):
            sums[k] = v
        return sums

    def _rollout_keys(self) -> list[str]:
        return [*ROLLOUT_KEYS, *(f"rewards/{r.name}/{s}" for r in self.rewards for s in ("sum", "squares"))]

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        n, groups, tokens = sums["completions"], sums["groups"], max(sums["tokens"], 1.0)
        out = {
            "reward": sums["reward_sum"] / n,
            "reward_std": spread(sums["reward_sum"], sums["reward_squares"], n),
            "reward_group_std": sums["group_std_sum"] / groups,
            "frac_reward_zero_std": sums["zero_std_groups"] / groups,
        }
        for r in self.rewards:
            out[f"rewards/{r.name}/mean"] = sums[f"rewards/{r.name}/sum"] / n
            out[f"rewards/{r.name}/std"] = spread(sums[f"rewards/{r.name}/sum"], sums[f"rewards/{r.name}/squares"], n)
        out["completions/mean_length"] = sums["length_sum"] / n
        out["completions/clipped_ratio"] = sums["truncated"] / n
        if "kl" in sums:
            out["kl"] = sums["kl"] / tokens
        for side in ("low", "high", "region"):
            out[f"clip_ratio/{side}_mean"] = sums[f"clip_{side}"] / tokens
        return out

    def training_state(self) -> dict[str, Any] | None:
        if self.rollout is None:
            return None
        batches = [{k: v.cpu() for k, v in b.items() if torch.is_tensor(v)} for b in self.rollout["batches"]]
        return {"generation": int(self.rollout["generation"]), "batches": batches}

    def load_training_state(self, state: dict[str, Any] | None) -> None:
        self.rollout = state

    # -- evaluation -------------------------------------------------------------------------------------------------
    def _greedy(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, Any]:
        from leantrain.model.generation import sample
        from leantrain.telemetry.flops import unwrap

        if not hasattr(self, "tokenizer"):  # `leantrain evaluate`: no training set it up
            raise RuntimeError("evaluation_data or prepare_data sets the tokenizer up")
        greedy = self._sampling(unwrap(model), None, 1.0)
        index = batch["index"].tolist()
        return {"completions": sample(model, [self.tables["eval"].ids[i] for i in index], 1, greedy)}

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        index, completions = batch["index"].tolist(), outputs["completions"]
        scores = torch.from_numpy(self._score(self.tables["eval"], index, completions, 1))
        device = batch["index"].device
        rows = {"reward": (scores @ self.weights).float().to(device)}
        rows.update({f"reward_{j}": scores[:, j].float().to(device) for j in range(scores.shape[1])})
        rows["length"] = torch.tensor([len(c) for c in completions], device=device)
        return rows

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        out = {"reward": float(rows["reward"].mean())}
        out.update({f"rewards/{r.name}/mean": float(rows[f"reward_{j}"].mean()) for j, r in enumerate(self.rewards)})
        out["completions/mean_length"] = float(rows["length"].mean())
        return out

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        return [(f"eval {k} (greedy)", f"{v:.4f}") for k, v in metrics.items()]

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        rows = data.train.features
        crc = zlib.crc32(np.ascontiguousarray(rows.input_ids).tobytes())
        crc = zlib.crc32(np.ascontiguousarray(rows.offsets).tobytes(), crc)
        return {"train_examples": len(data.train), "label_names": [], "data_fingerprint": crc}

    # -- inference --------------------------------------------------------------------------------------------------
    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        """The config's `eval_data` prompts, each completed greedily and scored by the run's rewards."""
        cfg, notes = self.cfg, list[str]()
        self.tokenizer = self._tokenizer(model_path)
        held = self._fitting(self._read(cfg.eval_data, "eval", self.tokenizer), "evaluation", notes)
        self._load_rewards(held, notes)
        self.tables = {"eval": held}
        return TaskData(None, held.examples(), [], self.tokenizer, notes, facts={"prompts": len(held.prompts)})

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        from leantrain.tasks.causal_lm import CausalLM

        return CausalLM.prediction_data(self, model_path, model_config, inputs)  # type: ignore[arg-type]

    def predict(self, model, data: TaskData, shown, rows_of, inputs) -> list[dict[str, Any]]:
        from leantrain.tasks.causal_lm import generate

        return generate(model, data.processor, [s["prompt"] for s in shown], **inputs.generation)


#: what each rollout adds to the log window, before the per-reward sums
ROLLOUT_KEYS = (
    "completions", "groups", "reward_sum", "reward_squares", "group_std_sum", "zero_std_groups", "length_sum",
    "truncated",
)  # fmt: skip


def rollout_sums(
    scores: torch.Tensor, total: torch.Tensor, tokens: torch.Tensor, group: int, most: int, completions, eos
) -> torch.Tensor:
    """A rollout's logged sums, in the order of ROLLOUT_KEYS then each reward's (sum, sum of squares)."""
    grouped = total.view(-1, group)
    std = grouped.std(1)
    truncated = sum(1 for c in completions if len(c) == most and c[-1] not in eos)
    head = [
        float(len(total)), float(grouped.shape[0]), float(total.sum()), float((total**2).sum()), float(std.sum()),
        float((std == 0).sum()), float(tokens.sum()), float(truncated),
    ]  # fmt: skip
    per_reward = [
        x for j in range(scores.shape[1]) for x in (float(scores[:, j].sum()), float((scores[:, j] ** 2).sum()))
    ]
    return torch.tensor(head + per_reward, dtype=torch.float64)


def spread(total: float, squares: float, n: float) -> float:
    """The standard deviation (Bessel's) of n values from their sum and sum of squares."""
    if n < 2:
        return 0.0
    return math.sqrt(max(squares - total * total / n, 0.0) / (n - 1))


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """Sequences in order, laid end to end in rows of at most `width` tokens (a new row when the next does not fit)."""
    rows: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if rows[-1] and used + n > width:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def prompt_turns(df, source: str, column: str | None) -> tuple[list[Any], str]:
    """Each row's prompt: --text-column, else the 'prompt' column (text, or a chat as a list of role/content messages),
    else the chats of a 'messages' column without their last assistant message; and the column it came from."""
    from leantrain.data.instructions import as_turn, chat_prompts

    by_name = {str(c).lower(): str(c) for c in df.columns}
    if column is None and "prompt" not in by_name and "messages" in by_name:
        return chat_prompts(df, source), by_name["messages"]
    if column is not None and column not in df.columns:
        names = ", ".join(repr(str(c)) for c in df.columns)
        raise DataError(f"{source}: no column '{column}' (given by --text-column); columns are {names}")
    column = column or by_name.get("prompt")
    if column is None:
        raise DataError(
            f"{source}: no prompt column (columns: {', '.join(map(str, df.columns))}); GRPO reads a 'prompt' column "
            "(text or chat messages) or a 'messages' column; name another with --text-column"
        )
    return [as_turn(v, source, column, i) for i, v in enumerate(df[column])], column


def encode_prompts(tokenizer, prompts: list[Any], chunk: int = 2048) -> list[list[int]]:
    """Each prompt's tokens as `policy.encode_prompt` gives them (text with the tokenizer's special tokens; a chat
    rendered with its template and the cue for the assistant's turn), tokenized in batches."""
    from leantrain.data.instructions import render_chat

    chats = [not isinstance(p, str) for p in prompts]
    texts = [render_chat(tokenizer, p, prompt=True) if chat else p for p, chat in zip(prompts, chats)]
    out: list[list[int]] = [[] for _ in prompts]
    for special in (True, False):  # text prompts with special tokens, rendered chats without (they hold them)
        where = [i for i, chat in enumerate(chats) if chat != special]
        for start in range(0, len(where), chunk):
            part = where[start : start + chunk]
            enc = tokenizer([texts[i] for i in part], add_special_tokens=special, return_attention_mask=False)
            for i, ids in zip(part, enc["input_ids"]):
                out[i] = list(ids)
    return out
