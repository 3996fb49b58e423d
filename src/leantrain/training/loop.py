"""The training loop, read top to bottom: train -> train_step -> forward_backward_step.

Loss normalisation: each micro-batch contributes sum(per-example loss) / (examples in the whole
optimizer step, across micro-batches and processes). Summed over the step that is exactly the mean
loss of the global batch, however it was split; Accelerate's DDP averages gradients over N
processes, so the local loss is scaled by N to turn that average back into the sum.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from leantrain.config import DEFAULT_JOB_LIMIT, TrainConfig
from leantrain.errors import ConfigError

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class TrainResult:
    """What `leantrain.train` returns."""

    output_dir: Path
    model_dir: Path
    metrics: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)


def resolve_config(cfg: TrainConfig) -> TrainConfig:
    """Fill in what the defaults leave open, so config.yaml records exactly what ran."""
    from leantrain.data.sources import EMBEDDED_DATA
    from leantrain.data.tokenize import default_cache_dir
    from leantrain.models import EMBEDDED_MODEL
    from leantrain.run_dir import default_output_dir

    changes: dict[str, Any] = {}
    if cfg.data is None:
        changes["data"] = EMBEDDED_DATA
        if cfg.limit is None:
            changes["limit"] = DEFAULT_JOB_LIMIT
    if cfg.model is None:
        changes["model"] = EMBEDDED_MODEL
    if cfg.output_dir is None:
        changes["output_dir"] = str(default_output_dir())
    if cfg.cache_dir is None:
        changes["cache_dir"] = str(default_cache_dir())
    return cfg.replace(**changes)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


def forward_backward_step(model, batch, accelerator, amp) -> torch.Tensor:
    """One micro-batch: forward, window-normalised loss, backward. Returns the summed loss (detached)."""
    with amp.autocast():
        logits = model(**model_inputs(batch)).logits
    loss_sum = F.cross_entropy(logits.float(), batch["labels"], reduction="sum")
    loss = loss_sum * accelerator.num_processes / batch["window_examples"]
    amp.backward(loss)
    return loss_sum.detach()


def train_step(model, optimizer, scheduler, amp, max_grad_norm: float) -> tuple[float | None, bool]:
    """Close an optimizer step: clip, step, schedule, clear. Returns (pre-clip grad norm, skipped)."""
    grad_norm, skipped = amp.clip_and_step(model, optimizer, max_grad_norm)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


def train(config: TrainConfig | dict | None = None, **overrides: Any) -> TrainResult:
    """Fine-tune a model as `config` says; returns metrics and the paths written."""
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from leantrain import models, parallel
    from leantrain.data.batching import ClassificationDataset, Collator, GlobalBatchSampler, eval_batches
    from leantrain.data.prepare import prepare_data
    from leantrain.optim import build_optimizer, build_scheduler, optimizer_state_bytes
    from leantrain.parallel.local_sgd import LocalSGD
    from leantrain.parallel.precision import MixedPrecision
    from leantrain.run_dir import RunDir
    from leantrain.telemetry import Console, MetricsLog, Throughput, summary_table
    from leantrain.telemetry.memory import MemoryMeter, tensor_bytes
    from leantrain.training.evaluate import evaluate_loop

    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    cfg = resolve_config(config.replace(**overrides) if overrides else config)
    _quiet_transformers()
    run = RunDir(cfg.output_dir, overwrite=cfg.overwrite)
    run.check()

    precision, precision_why = parallel.choose_precision(cfg.precision)
    accelerator = parallel.make_accelerator(precision)
    amp = MixedPrecision(accelerator, precision)
    say = Console(enabled=accelerator.is_main_process)
    parallel.seed_everything(cfg.seed)

    # -- model and data ---------------------------------------------------------------------------
    model_path = models.resolve_model(None if cfg.model == models.EMBEDDED_MODEL else cfg.model)
    tokenizer = models.load_tokenizer(model_path)
    model_config = models.load_config(model_path)
    limit = models.max_supported_length(model_config, tokenizer)
    if limit is not None and cfg.max_length > limit:
        raise ConfigError(f"--max-length {cfg.max_length} is beyond what {cfg.model} supports ({limit}); "
                          f"use --max-length {limit} or less")
    data = prepare_data(cfg, tokenizer, Path(cfg.cache_dir))
    for note in data.notes:
        say.info(note)
    model = models.load_for_classification(model_path, data.label_names)
    if cfg.activation_checkpointing:
        models.enable_activation_checkpointing(model)
    say.info(models.describe(model))
    say.info(f"labels: {', '.join(data.label_names)}; precision {precision} ({precision_why}); "
             f"device {accelerator.device}, {accelerator.num_processes} process(es)")

    # -- batches, optimizer, schedule ---------------------------------------------------------------
    sampler = GlobalBatchSampler(data.train.lengths, cfg.batch_size, cfg.grad_accum, accelerator.num_processes,
                                 cfg.seed)
    collate = Collator(tokenizer.pad_token_id or 0, fixed_length=cfg.max_length if cfg.pad_to_max_length else None)
    train_loader = DataLoader(ClassificationDataset(data.train), batch_sampler=sampler, collate_fn=collate)
    eval_loader = DataLoader(ClassificationDataset(data.eval), collate_fn=collate,
                             batch_sampler=eval_batches(data.eval.lengths, cfg.batch_size * 2))
    steps_per_epoch = sampler.steps_per_epoch()
    if steps_per_epoch == 0:
        raise ConfigError(f"--data: {len(data.train)} training rows cannot feed {accelerator.num_processes} processes")
    total_steps = cfg.max_steps or max(1, math.ceil(steps_per_epoch * cfg.epochs))
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.scheduler, total_steps, cfg.warmup_ratio)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)
    compile_seconds = None
    if cfg.compile:
        model, compile_seconds = _compile(model, train_loader, accelerator, amp, say)
    local_sgd = LocalSGD(model, cfg.local_sgd_steps or 1, cfg.local_sgd_outer_lr, cfg.local_sgd_outer_momentum,
                         enabled=cfg.local_sgd_steps is not None)
    if cfg.local_sgd_steps is not None:
        say.info(local_sgd.reason)

    staging = run.begin() if accelerator.is_main_process else None
    log = MetricsLog(staging / "metrics.jsonl" if staging else None)
    say.info(f"training {len(data.train):,} examples for {total_steps:,} optimizer steps (global batch "
             f"{sampler.global_batch} = {cfg.batch_size} x {cfg.grad_accum} accumulation x "
             f"{accelerator.num_processes} processes; {steps_per_epoch:,} steps per epoch); writing {run.path}")

    # -- the loop ------------------------------------------------------------------------------------
    meter = Throughput(warmup_steps=min(10, max(1, total_steps // 10)))
    memory = MemoryMeter(accelerator.device)
    bar = tqdm(total=total_steps, desc="train", unit="step", disable=not (cfg.progress and accelerator.is_main_process),
               dynamic_ncols=True)
    step, micro_step, epoch = 0, 0, 0
    window_loss, window_count, logged_loss, logged_examples = 0.0, 0, 0.0, 0
    history: list[dict[str, Any]] = []
    started = time.perf_counter()
    model.train()
    memory.start()
    meter.start()
    with local_sgd:
        while step < total_steps:
            sampler.set_epoch(epoch)
            for batch in train_loader:
                window_end = bool(batch["window_end"])
                # Gradients are all-reduced once per optimizer step, never with local SGD.
                if local_sgd.enabled:
                    sync = local_sgd.no_sync()
                else:
                    sync = contextlib.nullcontext() if window_end else accelerator.no_sync(model)
                with sync:
                    loss_sum = forward_backward_step(model, batch, accelerator, amp)
                micro_step += 1
                window_loss += float(loss_sum)
                window_count += len(batch["labels"])
                meter.add(len(batch["labels"]), int(batch["num_tokens"]), batch["input_ids"].numel())
                if not window_end:
                    continue
                grad_norm, skipped = train_step(model, optimizer, scheduler, amp, cfg.max_grad_norm)
                step += 1
                local_sgd.step()
                meter.step_done()
                logged_loss += window_loss
                logged_examples += window_count
                window_loss, window_count = 0.0, 0
                bar.update(1)
                if step % cfg.log_every == 0 or step == total_steps:
                    row = {"step": step, "micro_step": micro_step,
                           "epoch": epoch + _epoch_progress(step, steps_per_epoch),
                           "loss": logged_loss / max(logged_examples, 1), "lr": scheduler.get_last_lr()[0],
                           "grad_norm": grad_norm, "skipped_steps": amp.skipped_steps,
                           "samples_per_second": meter.samples_per_second * accelerator.num_processes,
                           "tokens_per_second": meter.tokens_per_second * accelerator.num_processes,
                           "elapsed_seconds": time.perf_counter() - started}
                    log.write(row)
                    history.append(row)
                    bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}",
                                    sps=f"{row['samples_per_second']:.1f}")
                    logged_loss, logged_examples = 0.0, 0
                if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                    meter.pause()
                    local_sgd.sync()  # evaluate the averaged model, as the final one will be
                    metrics = evaluate_loop(model, eval_loader, accelerator)
                    log.write({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})
                    say.info(f"step {step}: " + ", ".join(f"eval {k} {v:.4f}" for k, v in metrics.items()))
                    model.train()
                    meter.start()
                if step >= total_steps:
                    break
            epoch += 1
    meter.pause()
    bar.close()
    peak = memory.report()

    # -- final evaluation and outputs ---------------------------------------------------------------
    eval_metrics = evaluate_loop(model, eval_loader, accelerator)
    log.write({"step": step, **{f"eval_{k}": v for k, v in eval_metrics.items()}})
    log.close()
    totals = _gather_totals(accelerator, meter)
    unwrapped = accelerator.unwrap_model(model)
    params = [p for p in unwrapped.parameters()]
    trainable = [p for p in params if p.requires_grad]
    state_bytes = optimizer_state_bytes(optimizer)
    metrics = {
        **{f"eval_{k}": v for k, v in eval_metrics.items()},
        "train_loss": history[-1]["loss"] if history else None,
        "optimizer_steps": step, "micro_steps": micro_step, "epochs": step / max(steps_per_epoch, 1),
        "skipped_steps": amp.skipped_steps,
        "train_examples": totals["examples"], "train_seconds": meter.seconds,
        "train_samples_per_second": totals["examples"] / meter.seconds if meter.seconds else None,
        "train_tokens_per_second": totals["tokens"] / meter.seconds if meter.seconds else None,
        "steady_samples_per_second": meter.steady_samples_per_second * accelerator.num_processes,
        "steady_tokens_per_second": meter.steady_tokens_per_second * accelerator.num_processes,
        "padding_fraction": 1 - totals["tokens"] / totals["padded"] if totals["padded"] else 0.0,
        "compile_seconds": compile_seconds,
        "wall_seconds": time.perf_counter() - started,
        **peak,
        "weights_bytes": tensor_bytes(params),
        "gradients_bytes": tensor_bytes(trainable),
        "optimizer_state_bytes": state_bytes,
        "optimizer_state_bytes_per_param": state_bytes / max(sum(p.numel() for p in trainable), 1),
        "local_sgd_syncs": local_sgd.num_syncs if local_sgd.enabled else None,
        "local_sgd_bytes_communicated": local_sgd.bytes_communicated if local_sgd.enabled else None,
        "precision": precision, "num_processes": accelerator.num_processes,
        "global_batch": sampler.global_batch, "num_labels": len(data.label_names),
    }
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_outputs(staging, unwrapped, tokenizer, cfg, metrics)
        run.publish()
    accelerator.wait_for_everyone()
    mb = 1 / 2**20
    say.info(summary_table(f"leantrain run {run.path}", [
        ("eval accuracy", f"{eval_metrics['accuracy']:.4f}"),
        ("eval macro-F1", f"{eval_metrics['macro_f1']:.4f}"),
        ("eval loss", f"{eval_metrics['loss']:.4f}"),
        ("train loss (last log)", f"{metrics['train_loss']:.4f}" if metrics["train_loss"] is not None else "-"),
        ("optimizer steps", f"{step:,}" + (f" ({amp.skipped_steps} skipped: fp16 overflow)" if amp.skipped_steps else "")),
        ("samples/s (train)", f"{metrics['train_samples_per_second']:.1f}"),
        ("tokens/s (train, no padding)", f"{metrics['train_tokens_per_second']:.0f}"),
        ("padding", f"{metrics['padding_fraction']:.1%}"),
        ("peak memory over baseline", f"{peak['peak_memory_over_baseline_bytes'] * mb:.0f} MB"
         if peak.get("peak_memory_over_baseline_bytes") is not None else "-"),
        ("optimizer state", f"{state_bytes * mb:.1f} MB"),
        ("wall time", f"{metrics['wall_seconds']:.1f} s"),
    ]).rstrip())
    out = run.path
    return TrainResult(output_dir=out, model_dir=out / "model", metrics=metrics,
                       paths={"model": out / "model", "metrics": out / "metrics.json",
                              "log": out / "metrics.jsonl", "config": out / "config.yaml"})


def _compile(model, loader, accelerator, amp, say):
    """torch.compile, then run one forward so compile time is measured apart from training throughput."""
    say.info("compiling the model (torch.compile); the first step pays for it")
    started = time.perf_counter()
    compiled = torch.compile(model)
    batch = next(iter(loader))
    with torch.no_grad(), amp.autocast():
        compiled(**model_inputs(batch))
    return compiled, time.perf_counter() - started


def _quiet_transformers() -> None:
    """leantrain reports loading and saving itself; the libraries' own bars would interleave with ours."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _epoch_progress(step: int, steps_per_epoch: int) -> float:
    return ((step - 1) % max(steps_per_epoch, 1) + 1) / max(steps_per_epoch, 1)


def _gather_totals(accelerator, meter) -> dict[str, int]:
    t = torch.tensor([meter.examples, meter.tokens, meter.padded_tokens], dtype=torch.float64,
                     device=accelerator.device)
    t = accelerator.reduce(t, reduction="sum")
    return {"examples": int(t[0]), "tokens": int(t[1]), "padded": int(t[2])}


def _write_outputs(staging: Path, model, tokenizer, cfg: TrainConfig, metrics: dict[str, Any]) -> None:
    import json

    import yaml

    model.save_pretrained(staging / "model", safe_serialization=True)
    tokenizer.save_pretrained(staging / "model")
    (staging / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
