"""Causal language modelling: continued pretraining on plain text, documents packed into rows, loss per token.

The loss is summed over counted tokens and `loss_units` gives each row's counted tokens, so the trainer divides
by the counted tokens of the whole optimizer step (across micro-batches and processes): accumulation and N
processes stay exact at the token level, however unevenly the tokens fall into micro-batches.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.data.split import beyond_limit
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.base import Task, TaskData, same_logits
from leantrain.telemetry.console import counted

#: BPE vocabulary of the tokenizer a from-scratch preset trains on the run's text
PRESET_VOCAB_SIZE = 8192
#: the label of a position that counts for nothing (PyTorch's and transformers' convention)
IGNORE = -100
#: the longest rows a language model leantrain did not train is scored in (transformers' run_clm.py blocks text alike)
LM_CONTEXT_CAP = 1024


class CausalLM(Task):
    name: ClassVar[str] = "causal-lm"
    plain_folder: ClassVar[str] = "text"
    aliases: ClassVar[tuple[str, ...]] = ("text-generation", "sft")  # the pipeline's name, TRL's trainer's
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "position_ids")
    auto_model: ClassVar[str] = "AutoModelForCausalLM"
    model_mapping: ClassVar[str] = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    architectures: ClassVar[tuple[str, ...]] = ("ForCausalLM", "LMHeadModel")  # LMHeadModel: GPT-2's spelling
    pipeline: ClassVar[str] = "text-generation"
    planner: ClassVar[str | None] = "causal-lm"
    generates: ClassVar[bool] = True
    empty_prompts: ClassVar[bool] = True
    metric_names: tuple[str, ...] = ("loss", "perplexity", "exact_match")  # an instance may narrow them
    #: --metric-for-best when not given: lower loss is better
    default_metric: ClassVar[str] = "loss"
    #: whether training computes logits only where a token counts (`forward`); set by `check_model`
    selects_logits: bool = False
    #: whether training runs the output head and the loss in one chunked pass (`forward`); set by `check_model`
    fuses_head_loss: bool = False

    @property
    def packing(self) -> bool:
        """--packing: on unless --no-packing."""
        return self.cfg.packing is not False

    # -- data and model ------------------------------------------------------------------------------------------
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import prepare_sources
        from leantrain.model import presets

        cfg = self.cfg
        cache = Path(cfg.cache_dir)
        tokenizer = self._tokenizer(model_path, cache)
        if not presets.is_preset(model_path):  # a preset's table is sized to its tokenizer
            from leantrain.model import loading

            loading.check_tokenizer_fits(tokenizer, model_config, model_path)
        notes: list[str] = []
        self.instruction = False
        data = prepare_sources(
            cfg,
            lambda source_cfg, _codec: self._documents(source_cfg, tokenizer, cache),
            finish=lambda docs, eval_docs: self._rows(docs, eval_docs, notes),
        )
        how = "packed into" if self.packing else "one document per row (padded),"
        train_rows = data.train.features
        notes.append(
            f"{int(train_rows.counted.sum()):,} training tokens counted, {how} {len(train_rows):,} rows of at "
            f"most {cfg.max_length} tokens"
        )
        config = None
        if presets.is_preset(model_path):
            config = presets.preset_config(model_path, vocab_size=len(tokenizer))
        return TaskData(
            data.train, data.eval, [], tokenizer, data.notes + notes, model_config=config, sources=data.facts()
        )

    def _documents(self, cfg: Any, tokenizer: Any, cache: Path) -> Any:
        """One source's training and held-out documents (`cfg`: the run's config as the source sees it)."""
        from leantrain.data.combine import SourceData
        from leantrain.data.instructions import set_chat_template
        from leantrain.data.lm import is_text_source, load_documents
        from leantrain.data.sources import read_options, resolve_data_path

        source = resolve_data_path(cfg.data)
        template = tokenizer.chat_template
        if cfg.chat_template != self.cfg.chat_template:  # the source's own chat template renders its messages
            set_chat_template(tokenizer, cfg.chat_template)
        common = dict(tokenizer=tokenizer, cache_dir=cache, glob=cfg.text_glob, text_column=cfg.text_column,
                      train_on_prompt=cfg.train_on_prompt)  # fmt: skip
        try:
            docs, note = load_documents(source, split="train", options=read_options(cfg, "train"), **common)
            notes = [note]
            if cfg.eval_data:
                options = read_options(cfg, "eval")
                eval_docs, eval_note = load_documents(cfg.eval_data, split="eval", options=options, **common)
                notes.append(eval_note)
        finally:
            tokenizer.chat_template = template
        if not cfg.eval_data:
            if len(docs) < 2:
                where = _one_document_hint(source, cfg.text_documents) if is_text_source(source) else ""
                raise DataError(
                    f"{source}: only {len(docs)} document{where}; need two to hold one out (or give --eval-data)"
                )
            order = np.random.default_rng(cfg.seed).permutation(len(docs))
            held = max(1, round(len(docs) * cfg.eval_fraction))
            eval_docs, docs = docs.subset(np.sort(order[:held])), docs.subset(np.sort(order[held:]))
            share = f"{cfg.eval_fraction:.0%}, seed {cfg.seed}"
            notes.append(f"held out {counted(held, 'document')} ({share}) for evaluation")
        if cfg.limit is not None and cfg.limit < len(docs):
            keep = np.sort(np.random.default_rng(cfg.seed + 1).permutation(len(docs))[: cfg.limit])
            docs = docs.subset(keep)
            notes.append(f"training on a random sample of {cfg.limit:,} documents (--limit)")
        elif over := beyond_limit(cfg.limit, len(docs), "documents"):
            notes.append(over)
        return SourceData(docs, eval_docs, notes)

    def _rows(self, docs: Any, eval_docs: Any, notes: list[str]) -> tuple[Any, Any]:
        """A source's documents packed into training rows, and its evaluation rows (instruction data: whole documents
        a row; evaluation one a row, so that exact match is per example)."""
        from leantrain.data.lm import pack
        from leantrain.data.prepare import Examples

        instruction = docs.token_type_ids is not None
        self.instruction = self.instruction or instruction
        if instruction:
            docs, eval_docs = self._keep_completions(docs, eval_docs, notes)
        train_rows = pack(docs, self.cfg.max_length, self.packing, whole=instruction)
        eval_rows = pack(eval_docs, self.cfg.max_length, packing=self.packing and not instruction)
        return (
            Examples(train_rows, train_rows.counted.astype(np.int64)),
            Examples(eval_rows, eval_rows.counted.astype(np.int64)),
        )

    def _eval_rows(self, docs):
        """Instruction data one document per row (exact match is per example); plain text as training packs it."""
        from leantrain.data.lm import pack

        return pack(docs, self.cfg.max_length, packing=self.packing and not self.instruction)

    def _keep_completions(self, docs, eval_docs, notes: list[str]):
        """Instruction rows cut to --max-length; rows left without a completion token are skipped and counted."""
        from leantrain.data.instructions import keep_completions

        length = self.cfg.max_length
        out = []
        for what, d in (("training", docs), ("evaluation", eval_docs)):
            kept, dropped = keep_completions(d, length)
            if len(kept) == 0:
                raise DataError(
                    f"--data: no {what} row keeps a completion token within --max-length {length}; raise "
                    "--max-length or shorten the prompts"
                )
            if dropped:
                notes.append(f"skipped {dropped:,} {what} rows whose completion lies beyond --max-length {length}")
            out.append(kept)
        return out

    def _tokenizer(self, model_path: str, cache: Path):
        from leantrain.data.instructions import set_chat_template
        from leantrain.model import loading, presets

        cfg = self.cfg
        if presets.is_preset(model_path):  # from scratch: a BPE trained on this run's training text
            tokenizer = self._preset_tokenizer(cache)
        else:
            tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
        if tokenizer.pad_token_id is None:  # GPT-2, Llama: padding is never counted, EOS serves
            tokenizer.pad_token = tokenizer.eos_token
        set_chat_template(tokenizer, cfg.chat_template)
        return tokenizer

    def _preset_tokenizer(self, cache: Path):
        """The BPE trained on the training text of every source of --data, each read its own way."""
        from leantrain.data.combine import source_config, sources_of
        from leantrain.data.lm import mixture_tokenizer
        from leantrain.data.sources import read_options, resolve_data_path
        from leantrain.data.spec import is_mixture

        specs = sources_of(self.cfg)
        configs = [source_config(self.cfg, s) if is_mixture(specs) else self.cfg for s in specs]
        sources = [(resolve_data_path(c.data), c.text_glob, c.text_column, read_options(c, "train")) for c in configs]
        return mixture_tokenizer(sources, PRESET_VOCAB_SIZE, cache)

    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        from leantrain.model import loading

        model = loading.load_for_causal_lm(model_path, data.model_config, trust_remote_code=self.cfg.trust_remote_code)
        limit = loading.max_supported_length(model.config)
        if limit is not None and self.cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {self.cfg.max_length} is beyond what {self.cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less"
            )
        return model

    def check_model(self, model: torch.nn.Module) -> None:
        if self.packing:  # after the attention choice: the kernel that will run must keep documents apart
            check_packing_separates(model)
        # A compiled model keeps the full logits: a data-dependent row count would give it a graph per batch.
        rows = not self.cfg.compile and head_rows_work(model)
        self.fuses_head_loss = rows and head_loss_works(model)
        # padded to a fixed length, the logits are a full batch's (one shape, the peak `plan --probe` measures),
        # except where the fused loss keeps them from existing
        self.selects_logits = rows and (self.fuses_head_loss or not getattr(self.cfg, "pad_to_max_length", False))

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.lm import LMCollator

        fixed = self.cfg.max_length if self.cfg.pad_to_max_length else None
        return LMCollator(data.processor.pad_token_id, packing=self.packing, fixed_length=fixed)

    # -- a step --------------------------------------------------------------------------------------------------
    def model_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        # No cache: transformers keeps packed documents apart only when no cache (and no attention mask) is given.
        return {**super().model_inputs(batch), "use_cache": False}

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The logits only at positions whose next token counts: the output head's input is cut to those rows
        (row-major), so the logits are (counted tokens, vocabulary). Uncounted positions (prompts, padding, each
        document's last token) have no loss and so no gradient: the same loss, gradients and evaluation, up to
        rounding, for the head's work and its batch x length x vocabulary logits only where a token counts."""
        if not self.selects_logits:
            return model(**self.model_inputs(batch))
        targets = next_token_targets(batch["labels"])
        keep = targets != IGNORE
        # Training needs only the loss: the head and the cross-entropy run in one pass over chunks of rows, so the
        # (counted tokens, vocabulary) logits and their gradient never exist whole; the "logits" are the loss sum.
        fused = self.fuses_head_loss and torch.is_grad_enabled()
        if not fused:
            with head_rows(model, keep):
                return model(**self.model_inputs(batch))
        wanted = targets[keep]
        # a mixture's batch: each counted token's loss too, for each source's training loss (`row_losses`)
        self._token_losses = torch.empty(wanted.shape, dtype=torch.float32, device=wanted.device) if (
            "source" in batch) else None  # fmt: skip
        with head_loss(model, keep, wanted, self._token_losses):
            return model(**self.model_inputs(batch))

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return int((next_token_targets(batch["labels"]) != IGNORE).sum()) if self.selects_logits else None

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.telemetry.flops import row_flops, unwrap

        return row_flops(unwrap(model).get_output_embeddings().parameters()) if self.selects_logits else 0.0

    def loss_units(self, data: TaskData) -> np.ndarray:
        return data.train.features.counted.astype(np.float64)

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor | None:
        """Each row's summed loss over its counted tokens."""
        logits = outputs.logits.detach()
        if logits.dim() == 3:
            return token_losses(logits, batch["labels"]).sum(-1)
        targets = next_token_targets(batch["labels"])
        keep = targets != IGNORE
        if logits.dim() == 0:  # the fused head wrote each counted token's loss (`forward`)
            per_token = getattr(self, "_token_losses", None)
            if per_token is None:
                return None
        else:
            per_token = F.cross_entropy(logits.float(), targets[keep], reduction="none")
        rows = keep.nonzero(as_tuple=True)[0]
        return torch.zeros(keep.shape[0], dtype=torch.float32, device=keep.device).index_add_(0, rows, per_token)

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        if outputs.logits.dim() == 0:  # `forward` computed the loss with the head (`head_loss`)
            return outputs.logits
        if outputs.logits.dim() == 2:  # `forward` computed only the counted positions' logits
            targets = next_token_targets(batch["labels"])
            return F.cross_entropy(outputs.logits.float(), targets[targets != IGNORE], reduction="sum")
        return token_losses(outputs.logits, batch["labels"]).sum()

    # -- evaluation ----------------------------------------------------------------------------------------------
    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        targets = next_token_targets(batch["labels"])
        counted = targets != IGNORE
        logits = outputs.logits  # (counted tokens, vocabulary) from `forward`, else every position's
        if logits.dim() == 3:
            logits = logits[counted]
        wanted = targets[counted]
        per_position = torch.zeros(counted.shape, dtype=torch.float32, device=counted.device)
        per_position[counted] = F.cross_entropy(logits.float(), wanted, reduction="none")
        # Greedy decoding generates a completion exactly iff each of its tokens is the argmax given the ones
        # before it, which one teacher-forced pass shows (instruction data: one example per evaluation row)
        wrong = torch.zeros_like(counted)
        wrong[counted] = logits.argmax(-1) != wanted
        return {"loss_sum": per_position.sum(-1), "tokens": counted.sum(-1), "exact": (~wrong.any(-1)).long()}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        tokens = float(rows["tokens"].sum())
        loss = float(rows["loss_sum"].sum()) / max(tokens, 1.0)
        out = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
        if getattr(self, "instruction", False):
            out["exact_match"] = float(rows["exact"].mean())
        return out

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        rows = [
            ("eval loss (per token)", f"{metrics['loss']:.4f}"),
            ("eval perplexity", f"{metrics['perplexity']:.2f}"),
        ]
        if "exact_match" in metrics:
            rows.append(("eval exact match (greedy)", f"{metrics['exact_match']:.4f}"))
        return rows

    # -- inference -------------------------------------------------------------------------------------------------
    @classmethod
    def inference_defaults(cls, model_config: Any) -> dict[str, Any]:
        """A model leantrain did not train: one document per row (no probe of its attention), in rows of its
        context up to LM_CONTEXT_CAP tokens (a pretrained base's perplexity depends on how much context each
        token has)."""
        context = getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "n_positions", None)
        return {"packing": False, "train_on_prompt": False, "max_length": min(int(context or 128), LM_CONTEXT_CAP)}

    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        """The config's `eval_data` as the run's evaluation rows, with the model's tokenizer: loss per counted token
        and perplexity (instruction rows: their completions, and exact match), as the run's evaluation computes them."""
        from leantrain.data.instructions import keep_completions
        from leantrain.data.lm import load_documents
        from leantrain.data.prepare import Examples
        from leantrain.data.sources import read_options

        cfg, source = self.cfg, self.cfg.eval_data
        tokenizer = self._tokenizer(model_path, Path(cfg.cache_dir))
        docs, _ = load_documents(
            source, tokenizer, Path(cfg.cache_dir), "eval", options=read_options(cfg, "eval"), glob=cfg.text_glob,
            text_column=cfg.text_column, train_on_prompt=cfg.train_on_prompt,
        )  # fmt: skip
        self.instruction = docs.token_type_ids is not None
        if self.instruction:
            docs, _ = keep_completions(docs, cfg.max_length)
            if len(docs) == 0:
                raise DataError(
                    f"{source}: no row keeps a completion token within --max-length {cfg.max_length}; raise "
                    "--max-length or shorten the prompts"
                )
        rows = self._eval_rows(docs)
        examples = Examples(rows, rows.counted.astype(np.int64))
        return TaskData(None, examples, [], tokenizer, facts={"documents": len(docs)})

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        return {**data.facts, "tokens": int(rows["tokens"].sum())}

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        """The prompts: --text, else the table's (`prompts_of`); with --chat each a user's message."""
        from leantrain.model import loading

        if inputs.files is not None:
            raise DataError(f"{model_path}: a language model; give prompts with --text or a table with --data")
        prompts: list[Any] = inputs.texts if inputs.texts is not None else prompts_of(self.cfg)
        if inputs.chat:
            prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
        if not prompts:
            raise DataError("predict: no prompt to complete")
        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        return TaskData(None, None, [], tokenizer), [{"prompt": p} for p in prompts]

    def predict(self, model, data: TaskData, shown, rows_of, inputs) -> list[dict[str, Any]]:
        """Completions of the prompts, greedy or sampled (`generate`)."""
        prompts = [s["prompt"] for s in shown]
        return generate(model, data.processor, prompts, **inputs.generation)

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        rows = data.train.features
        crc = zlib.crc32(np.ascontiguousarray(rows.input_ids).tobytes())
        crc = zlib.crc32(np.ascontiguousarray(rows.labels).tobytes(), crc)
        return {"train_examples": len(data.train), "label_names": [], "data_fingerprint": crc}


@contextlib.contextmanager
def head_rows(model: torch.nn.Module, keep: torch.Tensor) -> Iterator[None]:
    """Within: the model's output head (its output embeddings) runs on the positions `keep` marks, row-major."""
    from leantrain.telemetry.flops import unwrap

    head = unwrap(model).get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda _head, args: (args[0][keep], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def head_loss(
    model: torch.nn.Module, keep: torch.Tensor, targets: torch.Tensor, row_losses: torch.Tensor | None = None
) -> Iterator[None]:
    """Within: the model's output head returns the summed cross-entropy of the positions `keep` marks (row-major)
    against `targets`, with its own weight (`losses.head_cross_entropy_sum`), in place of logits."""
    from leantrain.model.losses import head_cross_entropy_sum
    from leantrain.telemetry.flops import unwrap

    head = unwrap(model).get_output_embeddings()
    head.forward = lambda hidden: head_cross_entropy_sum(hidden[keep], head.weight, head.bias, targets, row_losses)
    try:
        yield
    finally:
        del head.forward


def _probe_inputs(model: Any, decoder: bool) -> dict[str, Any]:
    """One short row of valid ids for the checks below (with `decoder`: the decoder's too, an encoder-decoder's)."""
    vocab = int(getattr(model.config, "vocab_size", None) or 16)  # any valid ids will do
    device = next(model.parameters()).device
    ids = ((torch.arange(6) * 7 + 3) % vocab).unsqueeze(0).to(device)
    return {"input_ids": ids, **({"decoder_input_ids": ids} if decoder else {}), "use_cache": False}


def head_loss_works(model: Any, decoder: bool = False) -> bool:
    """Whether `head_loss` gives the loss of the chosen positions' logits: the head must be a plain linear layer
    (not an adapter's or a quantized one, whose weight is not the whole map) and the model must hand its output on
    unchanged (no scaling or capping of the logits). One short row, fused against the model's own logits (with
    `decoder`: the positions are the decoder's)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if type(head) is not torch.nn.Linear:
        return False
    inputs = _probe_inputs(model, decoder)
    keep = torch.tensor([[False, True, True, False, True, False]], device=head.weight.device)
    targets = inputs["input_ids"][keep].flip(0)

    def fused() -> torch.Tensor:
        with head_loss(model, keep, targets):
            return model(**inputs).logits

    def whole() -> torch.Tensor:
        logits = model(**inputs).logits[keep]
        return F.cross_entropy(logits.float(), targets, reduction="sum")

    return same_logits(model, whole, fused)


def head_rows_work(model: Any, decoder: bool = False) -> bool:
    """Whether `head_rows` gives the chosen positions' logits: the model's logits must be its output embeddings'
    output, row for row (not so for a model without them, or one that reshapes or recomputes its logits). One
    short row through the model, with and without the cut (with `decoder`: the positions are the decoder's)."""
    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        return False
    inputs = _probe_inputs(model, decoder)
    keep = torch.tensor([[False, True, True, False, True, False]], device=inputs["input_ids"].device)

    def cut() -> torch.Tensor:
        with head_rows(model, keep):
            return model(**inputs).logits

    return same_logits(model, lambda: model(**inputs).logits[keep], cut)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """What each position predicts, (batch, length): labels[t + 1] (the Hugging Face convention), and IGNORE at
    the last position, which predicts nothing."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's prediction of the next token, float32, (batch, length - 1); 0 where the
    label is not counted. Position t predicts labels[t + 1] (the Hugging Face convention)."""
    # The labels shift, not the logits: slicing the logits would copy them (batch x length x vocabulary) forward and
    # back; the last position gets an uncounted target instead. Bitwise the same losses and gradients, and the loss's
    # forward and backward 1.5x faster (tiny-llama's 16 x 128 x 8,192 logits: 150-160 ms against 240 ms).
    targets = next_token_targets(labels)
    flat = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return flat.view(targets.shape)[:, :-1]


def check_packing_separates(model: Any) -> None:
    """Refuse packing when the model's attention lets a packed document see the one before it: run two short
    documents packed in one row, then the second alone, and compare the second's logits."""
    vocab = int(model.config.vocab_size)
    first, second = torch.arange(5) * 7 % vocab, (torch.arange(4) * 13 + 5) % vocab
    ids = torch.cat([first, second]).unsqueeze(0)
    positions = torch.cat([torch.arange(5), torch.arange(4)]).unsqueeze(0)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = model(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=False).logits[0, 5:]
            alone = model(input_ids=second.unsqueeze(0).to(device), use_cache=False).logits[0]
    except TypeError as exc:  # a forward without position_ids
        raise ConfigError(
            f"--packing: {type(model).__name__} cannot take position ids ({exc}); use --no-packing"
        ) from None
    finally:
        model.train(was_training)
    scale = float(alone.abs().max()) + 1.0
    if float((packed - alone).abs().max()) > 1e-3 * scale:
        impl = getattr(model.config, "_attn_implementation", None) or "default"
        raise ConfigError(
            f"--packing: {type(model).__name__} with {impl} attention lets packed documents attend to each other "
            "(its attention ignores restarting position ids); use --no-packing"
        )


def _one_document_hint(source: str, documents: str) -> str:
    """Why a text source read as one document, and the reading that would give more, for the refusal."""
    if documents != "paragraphs":
        return f" (read as --text-documents {documents})"
    path = Path(source)
    lines = 0
    if path.is_file():
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
    blank = "in text files a blank line ends a document"
    if lines > 1:
        return f" ({blank}; this one has {lines:,} lines: --text-documents lines reads one a line)"
    return f" ({blank})"


def prompts_of(cfg: Any) -> list[Any]:
    """The prompts of the config's `eval_data`: a text file's lines, one prompt each; of a table, --text-column,
    else its 'prompt' column, else the chats of its 'messages' column (each up to its last assistant message, which
    the model is to write), else its one text column."""
    from leantrain.data import instructions
    from leantrain.data.columns import resolve_columns
    from leantrain.data.sources import read_options, read_table, text_lines

    if (lines := text_lines(cfg.eval_data, getattr(cfg, "format", None))) is not None:  # one prompt a line
        return lines
    df, _ = read_table(cfg.eval_data, split="eval", options=read_options(cfg, "eval"))
    column = cfg.text_column
    if column is None and instructions.kind_of(df) == "messages":
        return instructions.chat_prompts(df, cfg.eval_data)
    if column is None and "prompt" in df.columns:
        column = "prompt"
    cols = resolve_columns(df, cfg.eval_data, column, None, None, require_label=False)
    return [str(t) for t in df[cols.text] if str(t).strip()]


#: a chat: role/content messages, as in a 'messages' column
Chat = list[dict[str, str]]


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str] | list[Chat],
    *,
    max_new_tokens: int = 32,
    temperature: float | None = None,
    top_p: float | None = None,
    batch_size: int = 16,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per prompt: the prompt and its completion (greedy without `temperature`; sampled, from `seed`, with
    it, optionally from the smallest set of tokens whose probability reaches `top_p`). A prompt that is a chat is
    rendered with the tokenizer's chat template and its generation prompt (the row has `messages`, not
    `prompt`)."""
    from leantrain.errors import LeantrainError

    if max_new_tokens <= 0:
        raise LeantrainError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
    if temperature is not None and temperature <= 0:
        raise LeantrainError(f"--temperature must be positive (leave it out for greedy decoding), got {temperature}")
    if top_p is not None and not (0 < top_p <= 1):
        raise LeantrainError(f"--top-p must be in (0, 1], got {top_p}")
    if top_p is not None and temperature is None:
        raise LeantrainError("--top-p samples: give --temperature too (e.g. 1.0), or leave both out for greedy")
    chats = not isinstance(prompts[0], str)
    path = getattr(model.config, "_name_or_path", "the model")
    texts = [p if isinstance(p, str) else render_chat(tokenizer, p, path) for p in prompts]
    tokenizer.padding_side = "left"  # generation continues each prompt from its last token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    sampling: dict[str, Any] = {"do_sample": False}
    if temperature is not None:
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p or 1.0, "top_k": 0}
    torch.manual_seed(seed)
    out = []
    key = "messages" if chats else "prompt"
    for start in range(0, len(prompts), batch_size):
        # a rendered chat holds its special tokens already, as in training (`data.instructions`)
        enc = _encoded(model, tokenizer, texts[start : start + batch_size], not chats, path)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling)
        completions = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out += [{key: p, "completion": c} for p, c in zip(prompts[start : start + batch_size], completions)]
    return out


def _encoded(model: Any, tokenizer: Any, texts: list[str], special: bool, path: str) -> Any:
    """The prompts' ids, left-padded. A prompt of no tokens (an empty one, where the tokenizer adds no BOS itself:
    GPT-2's) starts from the BOS token, as transformers' text-generation pipeline generates from nothing."""
    ids = tokenizer(texts, add_special_tokens=special)["input_ids"]
    if all(ids):
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=special)
    bos = getattr(getattr(model, "generation_config", None), "bos_token_id", None)
    bos = bos if bos is not None else tokenizer.bos_token_id
    if bos is None:
        raise DataError(f"{path}: an empty prompt, and the model has no BOS token to generate from; give a prompt")
    return tokenizer.pad({"input_ids": [row or [bos] for row in ids]}, return_tensors="pt")


def render_chat(tokenizer: Any, chat: Chat, path: str) -> str:
    """A chat as the model saw chats in training, ending with the template's prompt for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{path}: the model's tokenizer has no chat template to render a chat with; give plain prompts "
            "(--text without --chat, or a 'prompt' column)"
        )
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
