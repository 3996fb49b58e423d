"""`leantrain evaluate` and `predict` for a causal language model: the held-out loss and perplexity (and exact
match on instruction data) of a text, computed as the run's own evaluation computes them; completions of
prompts, greedy or sampled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leantrain.errors import DataError, LeantrainError

#: a chat: role/content messages, as in a 'messages' column
Chat = list[dict[str, str]]


def generate(
    path: str,
    prompts: list[str] | list[Chat],
    *,
    max_new_tokens: int = 32,
    temperature: float | None = None,
    top_p: float | None = None,
    batch_size: int = 16,
    seed: int = 0,
    attention: str | None = None,
) -> list[dict[str, Any]]:
    """One row per prompt: the prompt and its completion (greedy without --temperature; sampled, from `seed`,
    with it, optionally from the smallest set of tokens whose probability reaches --top-p). A prompt that is a
    chat is rendered with the tokenizer's chat template and its generation prompt (the row has `messages`, not
    `prompt`). `attention`: the run's --attention setting."""
    import torch
    from transformers import AutoModelForCausalLM

    from leantrain.model import loading
    from leantrain.model.attention import apply_forced

    if max_new_tokens <= 0:
        raise LeantrainError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
    if temperature is not None and temperature <= 0:
        raise LeantrainError(f"--temperature must be positive (leave it out for greedy decoding), got {temperature}")
    if top_p is not None and not (0 < top_p <= 1):
        raise LeantrainError(f"--top-p must be in (0, 1], got {top_p}")
    if top_p is not None and temperature is None:
        raise LeantrainError("--top-p samples: give --temperature too (e.g. 1.0), or leave both out for greedy")
    if not prompts:
        raise DataError("predict: no prompt to complete")
    tokenizer = loading.load_tokenizer(path)
    chats = not isinstance(prompts[0], str)
    texts = [p if isinstance(p, str) else render_chat(tokenizer, p, path) for p in prompts]
    tokenizer.padding_side = "left"  # generation continues each prompt from its last token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    apply_forced(model, attention)  # the kernel the run forced with --attention, if it did
    sampling: dict[str, Any] = {"do_sample": False}
    if temperature is not None:
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p or 1.0, "top_k": 0}
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = texts[start : start + batch_size]
        # a rendered chat holds its special tokens already, as in training (`data.instructions`)
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=not chats)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling)
        new = ids[:, enc["input_ids"].shape[1] :]
        completions = tokenizer.batch_decode(new, skip_special_tokens=True)
        key = "messages" if chats else "prompt"
        out += [{key: p, "completion": c} for p, c in zip(prompts[start : start + batch_size], completions)]
    return out


def render_chat(tokenizer, chat: Chat, path: str) -> str:
    """A chat as the model saw chats in training, ending with the template's prompt for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{path}: the model's tokenizer has no chat template to render a chat with; give plain prompts "
            "(--text without --chat, or a 'prompt' column)"
        )
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def evaluate(
    path: str,
    data: str,
    *,
    max_length: int,
    batch_size: int,
    cache_dir: str,
    text_column: str | None = None,
    read: Any = None,
    run: Callable[[str], Any] = lambda name: None,
) -> dict[str, Any]:
    """Loss per counted token and perplexity of `data` (a text file, a folder of them, or a table; instruction
    rows count their completions and add exact match), with the settings `run(name)` gives, the run's own
    (packing, prompt masking, attention): the numbers the run's evaluation reports for the same text."""
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM

    from leantrain import parallel
    from leantrain.config import TrainConfig
    from leantrain.data.batching import ExamplesDataset, eval_batches
    from leantrain.data.lm import LMCollator
    from leantrain.model.attention import apply_forced
    from leantrain.tasks.causal_lm import CausalLM
    from leantrain.tasks.evaluation import gather_rows

    packing, on_prompt = run("packing"), run("train_on_prompt")
    cfg = TrainConfig(
        model=path,
        data=data,
        task="causal-lm",
        max_length=max_length,
        packing=bool(packing),  # a model leantrain did not train: a document per row, no probe of its attention
        train_on_prompt=bool(on_prompt),
        text_column=text_column,
        cache_dir=cache_dir,
        progress=False,
        report=False,
    )
    task = CausalLM(cfg)
    rows, documents = task.evaluation_data(path, data, read)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    apply_forced(model, run("attention"))
    accelerator = parallel.make_accelerator("fp32")
    loader = DataLoader(
        ExamplesDataset(rows),
        batch_sampler=eval_batches(rows.lengths, batch_size),
        collate_fn=LMCollator(task.tokenizer.pad_token_id, packing=cfg.packing),
    )
    model, loader = accelerator.prepare(model, loader)
    task.check_model(model)  # packing kept apart; the head run only where a token counts
    out = gather_rows(model, loader, accelerator, task)
    return {**task.metrics(out), "documents": documents, "tokens": int(out["tokens"].sum())}
