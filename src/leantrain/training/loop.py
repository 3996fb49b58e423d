"""The training loop, read top to bottom: train -> train_step -> forward_backward_step.

Checkpoints (leantrain.checkpoint) are saved every --save-every optimizer steps and at each new best
evaluation; --resume restores one exactly, so a killed run resumed ends bitwise where the same run left
alone would have. The NaN guard checks each step's loss and gradient norm before the optimizer moves.

Loss normalisation: each micro-batch contributes sum(per-example loss) / (examples in the whole
optimizer step, across micro-batches and processes). Summed over the step that is exactly the mean
loss of the global batch, however it was split; Accelerate's DDP averages gradients over N
processes, so the local loss is scaled by N to turn that average back into the sum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from leantrain.config import DEFAULT_JOB_LIMIT, TrainConfig
from leantrain.errors import ConfigError, LeantrainError

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_values", "input_features")


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


def train_step(
    model, optimizer, scheduler, amp, accelerator, max_grad_norm: float, window_loss: float, on_nan: str
) -> tuple[float, bool]:
    """Close an optimizer step: unscale and clip, check, step, schedule, clear.

    Returns (pre-clip gradient norm, finite). The NaN guard: a non-finite loss, or a non-finite gradient
    norm (except under fp16 loss scaling, whose scaler skips overflowing steps as routine), on any process
    makes the step not finite. Then with --on-nan skip its gradients are dropped (the schedule moves on);
    with --on-nan stop nothing is touched, so the caller can save the last good state.
    """
    grad_norm = amp.unscale_and_clip(model, optimizer, max_grad_norm)
    values = [window_loss] if amp.scales_loss else [window_loss, grad_norm]
    finite = _all_finite(accelerator, values)
    if not finite and on_nan == "stop":
        return grad_norm, False
    if finite:
        amp.step(optimizer)
    else:
        amp.drop_step(optimizer)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


def train(config: TrainConfig | dict | None = None, **overrides: Any) -> TrainResult:
    """Fine-tune a model as `config` says; returns metrics and the paths written."""
    from leantrain import run_dir

    with run_dir.guarded():  # reliability (issue #19): release the output lock, undo --overwrite if unpublished
        return _train(config, **overrides)


def _train(config: TrainConfig | dict | None = None, **overrides: Any) -> TrainResult:
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from leantrain import checkpoint, models, parallel, run_dir
    from leantrain.data.batching import ClassificationDataset, Collator, GlobalBatchSampler, eval_batches
    from leantrain.data.prepare import prepare_data
    from leantrain.optim import build_optimizer, build_scheduler, optimizer_state_bytes
    from leantrain.parallel.local_sgd import LocalSGD
    from leantrain.parallel.precision import MixedPrecision
    from leantrain.run_dir import RunDir
    from leantrain.telemetry import Console, MetricsLog, Throughput, summary_table
    from leantrain.telemetry.flops import FlopMeter, flop_model
    from leantrain.telemetry.memory import MemoryMeter, tensor_bytes
    from leantrain.telemetry.peak import device_peak, distrust
    from leantrain.telemetry.report import write_environment, write_report
    from leantrain.telemetry.tensorboard_log import TeeLog, TensorBoardLogger, check_tensorboard
    from leantrain.telemetry.timing import StepTimer
    from leantrain.training import interrupt
    from leantrain.training.evaluate import evaluate_loop

    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    cfg = resolve_config(config.replace(**overrides) if overrides else config)
    plan = None
    if cfg.auto:  # --auto: the planner's recommendation sets precision, checkpointing, optimizer and the split
        from leantrain.planner.auto import plan_run

        cfg, plan = plan_run(cfg)
    _quiet_transformers()
    if cfg.log == "tensorboard":
        check_tensorboard()

    precision, precision_why = parallel.choose_precision(cfg.precision)
    accelerator = parallel.make_accelerator(precision, cfg.shard)
    if config.output_dir is None:  # every process must write under rank 0's timestamped default
        cfg = cfg.replace(output_dir=parallel.broadcast_from_main(cfg.output_dir))
    assert cfg.output_dir is not None and cfg.cache_dir is not None  # resolve_config filled them
    run = RunDir(cfg.output_dir, overwrite=cfg.overwrite)
    run.check()  # on every process, so each one fails with the message rather than waiting for the others
    amp = MixedPrecision(accelerator, precision)
    say = Console(enabled=accelerator.is_main_process)
    if plan is not None:
        say.info(plan.summary())
    parallel.seed_everything(cfg.seed)

    # -- which checkpoint to resume (refused now, before any work, if it is from a different run) ----------
    checkpoints = checkpoint.CheckpointDir(run.path / "checkpoints", accelerator)
    checkpoint.metric_key(cfg.metric_for_best)
    if cfg.shard != "none" and (cfg.save_every or cfg.resume):
        raise ConfigError(
            f"--save-every/--resume do not support --shard {cfg.shard} yet (a checkpoint holds whole replicas); "
            "train without sharding to checkpoint"
        )
    resume_from = _find_resume(cfg, run, checkpoints, accelerator, say)
    if resume_from is not None:
        resume_from.check_matches(cfg.to_dict(), {"precision": precision, "num_processes": accelerator.num_processes})

    # -- model and data ---------------------------------------------------------------------------
    model_path = models.resolve_model(None if cfg.model == models.EMBEDDED_MODEL else cfg.model)
    model_config = models.load_config(model_path, trust_remote_code=cfg.trust_remote_code)
    task = models.infer_task(model_config, cfg.task)
    media_config = None  # images and audio: the data side picks the processor from the model (data/media.py)
    if task == "text-classification":
        tokenizer = models.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
        limit = models.max_supported_length(model_config, tokenizer)
        if limit is not None and cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {cfg.max_length} is beyond what {cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less"
            )
        data = prepare_data(cfg, tokenizer, Path(cfg.cache_dir))
    else:
        from leantrain.data import media

        tokenizer = media.load_processor(model_path, model_config, task, cfg.max_seconds)  # saved like a tokenizer
        data = media.prepare_media_data(cfg, tokenizer, Path(cfg.cache_dir))
        media_config = media.model_config(model_path, model_config, tokenizer, cfg.trust_remote_code)
    for note in data.notes:
        say.info(note)
    data_facts = {
        "train_examples": len(data.train),
        "label_names": list(data.label_names),
        "data_fingerprint": _fingerprint(data.train),
    }
    if resume_from is not None:
        resume_from.check_matches({}, data_facts)
    model = models.load_for_classification(
        model_path, data.label_names, trust_remote_code=cfg.trust_remote_code, task=task, config=media_config
    )
    if cfg.activation_checkpointing:
        models.enable_activation_checkpointing(model)
    say.info(models.describe(model))
    say.info(
        f"labels: {', '.join(data.label_names)}; precision {precision} ({precision_why}); "
        f"device {accelerator.device}, {accelerator.num_processes} process(es)"
    )

    # -- batches, optimizer, schedule ---------------------------------------------------------------
    sampler = GlobalBatchSampler(
        data.train.lengths, cfg.batch_size, cfg.grad_accum, accelerator.num_processes, cfg.seed
    )
    collate: Any = Collator(tokenizer.pad_token_id or 0, fixed_length=cfg.max_length if cfg.pad_to_max_length else None)
    if media_config is not None:
        norm = getattr(data.train.tokens, "norm", None)  # uint8 pixels: normalised per batch
        collate = media.MediaCollator(task, norm)
        train_collate = media.MediaCollator(task, norm, augment=cfg.augment, seed=cfg.seed)
    # Each loader has its own generator: iterating one then draws nothing from the global RNG, so dropout
    # does not depend on when epochs begin or evaluations run, and a resumed run's RNG lines up exactly.
    train_loader = DataLoader(
        ClassificationDataset(data.train),
        batch_sampler=sampler,
        collate_fn=train_collate if media_config is not None else collate,
        generator=torch.Generator(),
    )
    eval_loader = DataLoader(
        ClassificationDataset(data.eval),
        collate_fn=collate,
        generator=torch.Generator(),
        batch_sampler=eval_batches(data.eval.lengths, cfg.batch_size * 2),
    )
    steps_per_epoch = sampler.steps_per_epoch()
    if steps_per_epoch == 0:
        raise ConfigError(f"--data: {len(data.train)} training rows cannot feed {accelerator.num_processes} processes")
    total_steps = cfg.max_steps or max(1, math.ceil(steps_per_epoch * cfg.epochs))
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.scheduler, total_steps, cfg.warmup_ratio)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )
    flops = FlopMeter(flop_model(accelerator.unwrap_model(model), getattr(data.train.tokens, "input_shapes", None)))
    flop_peak = device_peak(accelerator.device, precision)  # CPU: a ~1 s GEMM probe the first time, then cached
    flops.peak = flop_peak.flops_per_second
    say.info(
        (
            f"{flops.model.per_sequence / 1e6:.1f} MFLOP per example"
            if media_config is not None
            else f"{flops.model.per_padded_token(cfg.max_length // 2) / 1e6:.1f} MFLOP per token at length "
            f"{cfg.max_length // 2}"
        )
        + f" ({flops.model.source}); peak {flop_peak.flops_per_second / 1e12:.3g} TFLOP/s "
        f"({flop_peak.source})"
    )
    compile_seconds = None
    if cfg.compile:
        model, compile_seconds = _compile(model, train_loader, accelerator, amp, say)
    local_sgd = LocalSGD(
        model,
        cfg.local_sgd_steps or 1,
        cfg.local_sgd_outer_lr,
        cfg.local_sgd_outer_momentum,
        enabled=cfg.local_sgd_steps is not None,
    )
    if cfg.local_sgd_steps is not None:
        say.info(local_sgd.reason)

    staging = run.begin() if accelerator.is_main_process else None
    if staging is not None and plan is not None:
        plan.write(staging)  # plan.json and plan.md: what was predicted, and why this configuration
    log_path = staging / "metrics.jsonl" if staging else None
    progress = checkpoint.Progress(best_metric=cfg.metric_for_best)  # counters a checkpoint records
    history: list[dict[str, Any]] = []  # metrics.jsonl rows of training steps
    resume_rng = None
    trained_state = dict(model=model, optimizer=optimizer, scheduler=scheduler, amp=amp, local_sgd=local_sgd)
    if resume_from is not None:
        resume_rng = checkpoint.restore(resume_from, **trained_state, accelerator=accelerator)
        progress = resume_from.progress
        if progress.best_metric != cfg.metric_for_best:  # another yardstick: its best is yet to be seen
            progress.best_metric, progress.best_value, progress.best_step = cfg.metric_for_best, None, None
        if log_path is not None:
            history = [r for r in checkpoint.restore_log(resume_from, log_path) if "loss" in r]
        sampler.start_at(progress.epoch, progress.steps_in_epoch)  # a seek: the skipped batches are never built
        say.info(
            f"resuming from {resume_from.path}: step {progress.step}, {progress.steps_in_epoch} steps into "
            f"epoch {progress.epoch + 1}"
        )
    elif cfg.save_every:
        space_note = checkpoint.free_space_check(
            run.path, checkpoint.estimate_checkpoint_bytes(model, cfg.optimizer), cfg.save_total_limit
        )
        if space_note:
            say.info(f"warning: {space_note}")
    if staging is not None:
        write_environment(staging, device=accelerator.device, peak=flop_peak, num_processes=accelerator.num_processes)
    board = (
        TensorBoardLogger(staging / "tensorboard", config=cfg.to_dict())
        if cfg.log == "tensorboard" and staging is not None
        else None
    )
    log = TeeLog(MetricsLog(log_path), board)
    say.info(
        f"training {len(data.train):,} examples for {total_steps:,} optimizer steps (global batch "
        f"{sampler.global_batch} = {cfg.batch_size} x {cfg.grad_accum} accumulation x "
        f"{accelerator.num_processes} processes; {steps_per_epoch:,} steps per epoch); writing {run.path}"
    )

    # -- the loop ------------------------------------------------------------------------------------
    meter = Throughput(warmup_steps=min(10, max(1, total_steps // 10)))
    memory = MemoryMeter(accelerator.device)
    from leantrain.training.oom import OomGuard

    oom = OomGuard(  # --auto: out of memory halves the micro-batch and redoes the step (training/oom.py)
        cfg.auto,
        sampler,
        accelerator,
        memory,
        plan.request.budget if plan is not None else None,
        tensor_bytes(accelerator.unwrap_model(model).parameters()),
    )
    timer = StepTimer(accelerator.device)  # synchronises CUDA at phase boundaries
    bar = tqdm(
        total=total_steps,
        initial=min(progress.step, total_steps),
        desc="train",
        unit="step",
        disable=not (cfg.progress and accelerator.is_main_process),
        dynamic_ncols=True,
    )
    step, micro_step, epoch, steps_in_epoch = (
        progress.step,
        progress.micro_step,
        progress.epoch,
        progress.steps_in_epoch,
    )
    window_loss, window_count, logged_loss, logged_examples = 0.0, 0, progress.logged_loss, progress.logged_examples
    started = time.perf_counter() - progress.elapsed_seconds
    facts = {"precision": precision, "num_processes": accelerator.num_processes, **data_facts}

    def save(reason: str, rng: dict, **rollback: int) -> Path:
        """Checkpoint the run as it stands (or as it stood, with `rollback` counters); every process calls it."""
        meter.pause()
        now: dict[str, Any] = dict(
            step=step,
            micro_step=micro_step,
            epoch=epoch,
            steps_in_epoch=steps_in_epoch,
            logged_loss=logged_loss,
            logged_examples=logged_examples,
            elapsed_seconds=time.perf_counter() - started,
        )
        state = dataclasses.replace(progress, **{**now, **rollback})
        with timer.phase("checkpoint"):
            path = checkpoints.save(
                state,
                **trained_state,
                rng=rng,
                config=cfg.to_dict(),
                facts=facts,
                log_path=log_path,
                reason=reason,
                keep=cfg.save_total_limit,
            )
        meter.start()
        return path

    model.train()
    memory.start(resident=model.parameters())  # weights paged in first: the peak over the baseline is training's own
    meter.start()
    timer.start()
    if resume_rng is not None:
        checkpoint.set_rng_state(resume_rng)  # last, so that nothing above moves it
    with local_sgd:
        while step < total_steps:
            # Accelerate's loader hands the sampler its own count of passes: set both to this epoch.
            sampler.set_epoch(epoch)
            train_loader.set_epoch(epoch)
            for batch in timer.timed(oom.batches(train_loader)):  # the wait for each batch is "data"
                if window_count == 0:  # an optimizer step begins: what a NaN stop rolls back to
                    window_rng, window_micro_step = checkpoint.rng_state(), micro_step
                window_end = bool(batch["window_end"])
                # Gradients are all-reduced once per optimizer step, never with local SGD.
                if local_sgd.enabled:
                    sync = local_sgd.no_sync()
                else:
                    sync = contextlib.nullcontext() if window_end else accelerator.no_sync(model)
                with sync, timer.phase("forward_backward"):
                    loss_sum = oom.forward_backward(forward_backward_step, model, batch, accelerator, amp, step)
                if loss_sum is None:  # out of memory on some process (--auto): redo this step, micro-batch halved
                    event = oom.recut(optimizer, epoch, steps_in_epoch, step)
                    micro_step, window_loss, window_count = window_micro_step, 0.0, 0
                    say.info(f"step {step + 1}: out of memory; {oom.describe(event)}")
                    continue
                micro_step += 1
                window_loss += float(loss_sum)
                window_count += len(batch["labels"])
                # Images and audio have no tokens (and no padding): counted as 0, FLOPs per example.
                main = next(v for k, v in model_inputs(batch).items() if k != "attention_mask")
                meter.add(
                    len(batch["labels"]), int(batch.get("num_tokens", 0)), main.numel() if media_config is None else 0
                )
                flops.add(main, batch.get("attention_mask"))
                if not window_end:
                    continue
                with timer.phase("optimizer"):
                    grad_norm, finite = train_step(
                        model,
                        optimizer,
                        scheduler,
                        amp,
                        accelerator,
                        cfg.max_grad_norm,
                        window_loss / window_count,
                        cfg.on_nan,
                    )
                if not finite and cfg.on_nan == "stop":
                    # Nothing has moved yet: save the state before this step, then stop.
                    saved = checkpoints.root / f"{checkpoint.PREFIX}{step:06d}"
                    if step > 0 and not saved.is_dir() and cfg.shard == "none":
                        saved = save(
                            "last good state before a non-finite step", window_rng, micro_step=window_micro_step
                        )
                    bar.close()
                    log.close()
                    raise LeantrainError(
                        _nan_message(
                            step + 1,
                            window_loss / window_count,
                            grad_norm,
                            cfg.lr,
                            precision,
                            saved if saved.is_dir() else None,
                        )
                    )
                step += 1
                steps_in_epoch += 1
                with timer.phase("comm"):  # local SGD's parameter averaging, every --local-sgd-steps
                    local_sgd.step()
                meter.step_done()
                if meter.steps == meter.warmup_steps:
                    flops.mark()
                if finite:
                    logged_loss += window_loss
                    logged_examples += window_count
                else:
                    progress.nan_skipped_steps += 1
                    say.info(f"step {step}: non-finite loss or gradient norm; step skipped (--on-nan skip)")
                window_loss, window_count = 0.0, 0
                bar.update(1)
                if step % cfg.log_every == 0 or step == total_steps:
                    if accelerator.num_processes > 1:  # the global batch's loss, not this process's share
                        sums = torch.tensor(
                            [logged_loss, logged_examples], dtype=torch.float64, device=accelerator.device
                        )
                        logged_loss, logged_examples = accelerator.reduce(sums, reduction="sum").tolist()
                    row = {
                        "step": step,
                        "micro_step": micro_step,
                        "epoch": epoch + _epoch_progress(step, steps_per_epoch),
                        "loss": logged_loss / logged_examples if logged_examples else None,
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": grad_norm,
                        "skipped_steps": amp.skipped_steps,
                        "nan_skipped_steps": progress.nan_skipped_steps,
                        "samples_per_second": meter.samples_per_second * accelerator.num_processes,
                        "tokens_per_second": meter.tokens_per_second * accelerator.num_processes,
                        "elapsed_seconds": time.perf_counter() - started,
                        **flops.metrics(meter.elapsed()),
                        **timer.window_row(),
                        "peak_memory_bytes": memory.report()["peak_memory_bytes"],
                    }
                    log.write(row)
                    history.append(row)
                    wall = row["time_wall_seconds"] or 1.0
                    bar.set_postfix(
                        loss=f"{row['loss'] or float('nan'):.4f}",
                        lr=f"{row['lr']:.2e}",
                        sps=f"{row['samples_per_second']:.1f}",
                        mfu=f"{row['mfu']:.1%}" if row["mfu"] is not None else "-",
                        data=f"{row['time_data_seconds'] / wall:.0%}",
                    )
                    logged_loss, logged_examples = 0.0, 0
                new_best = False
                if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                    meter.pause()
                    with timer.phase("eval"):
                        with timer.phase("comm"):
                            local_sgd.sync()  # evaluate the averaged model, as the final one will be
                        metrics: dict[str, Any] = evaluate_loop(model, eval_loader, accelerator)
                    log.write({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})
                    say.info(f"step {step}: " + ", ".join(f"eval {k} {v:.4f}" for k, v in metrics.items()))
                    new_best = progress.update_best(metrics, step)
                    model.train()
                    meter.start()
                if cfg.save_every and (step % cfg.save_every == 0 or new_best):
                    save(
                        f"every {cfg.save_every} steps"
                        if step % cfg.save_every == 0
                        else f"best eval {cfg.metric_for_best}",
                        checkpoint.rng_state(),
                    )
                # interrupt (issue #19): Ctrl-C/SIGTERM stop every process here, after a checkpoint
                if (signum := interrupt.requested(accelerator)) is not None:
                    just_saved = cfg.save_every is not None and (step % cfg.save_every == 0 or new_best)
                    save_now = lambda why: save(why, checkpoint.rng_state())  # noqa: E731
                    raise interrupt.stop(signum, cfg, step, total_steps, checkpoints, just_saved, save_now)
                if step >= total_steps:
                    break
            epoch += 1
            steps_in_epoch = 0
    meter.pause()
    bar.close()
    peak = memory.report()

    # -- final evaluation and outputs ---------------------------------------------------------------
    with timer.phase("eval"):
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
        "optimizer_steps": step,
        "micro_steps": micro_step,
        "epochs": step / max(steps_per_epoch, 1),
        "skipped_steps": amp.skipped_steps,
        "nan_skipped_steps": progress.nan_skipped_steps,
        "resumed_from": str(resume_from.path) if resume_from is not None else None,
        "best_checkpoint": str(checkpoints.best()) if cfg.save_every and checkpoints.best() else None,
        "train_examples": totals["examples"],
        "train_seconds": meter.seconds,
        "train_samples_per_second": totals["examples"] / meter.seconds if meter.seconds else None,
        "train_tokens_per_second": totals["tokens"] / meter.seconds if meter.seconds and totals["padded"] else None,
        "steady_samples_per_second": meter.steady_samples_per_second * accelerator.num_processes,
        "steady_tokens_per_second": meter.steady_tokens_per_second * accelerator.num_processes
        if totals["padded"]
        else None,
        "padding_fraction": 1 - totals["tokens"] / totals["padded"] if totals["padded"] else None,  # None: no tokens
        "compile_seconds": compile_seconds,
        **flops.metrics(meter.seconds),  # this process's FLOPs over its training time, against one device's peak
        **flops.steady_metrics(meter.steady_seconds),  # the same after the warm-up steps: the headline MFU
        "flops_per_padded_token": flops.flops / totals["padded"] * accelerator.num_processes
        if totals["padded"]
        else None,
        "peak_tflops": flop_peak.flops_per_second / 1e12,
        "peak_source": flop_peak.source,
        "flop_model": flops.model.source,
        **timer.total_row(),
        "wall_seconds": time.perf_counter() - started,
        **peak,
        "weights_bytes": tensor_bytes(params),
        "gradients_bytes": tensor_bytes(trainable),
        "optimizer_state_bytes": state_bytes,
        "optimizer_state_bytes_per_param": state_bytes / max(sum(p.numel() for p in trainable), 1),
        "local_sgd_syncs": local_sgd.num_syncs if local_sgd.enabled else None,
        "local_sgd_bytes_communicated": local_sgd.bytes_communicated if local_sgd.enabled else None,
        "precision": precision,
        "num_processes": accelerator.num_processes,
        "global_batch": sampler.global_batch,
        **(oom.metrics() if cfg.auto else {}),
        "num_labels": len(data.label_names),
    }
    best_mfu = max(metrics["mfu"] or 0.0, metrics["steady_mfu"] or 0.0)
    if best_mfu > 1 and distrust(flop_peak, flop_peak.flops_per_second * best_mfu):
        say.info("warning: this run beat the cached peak FLOP/s (MFU above 100%); the next runs probe it again")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        assert staging is not None  # the main process stages the run
        with run_dir.writing(staging / "model", metrics["weights_bytes"]):  # reliability (issue #19): full disk
            _write_outputs(staging, unwrapped, tokenizer, cfg, metrics)
        if cfg.report:
            try:
                write_report(staging)
            except Exception as exc:  # a plot must never fail a finished run
                say.info(f"warning: report.html not written ({type(exc).__name__}: {exc})")
        run.publish()
    accelerator.wait_for_everyone()
    mb = 1 / 2**20
    over_baseline = peak.get("peak_memory_over_baseline_bytes")
    say.info(
        summary_table(
            "leantrain run",
            [
                ("eval accuracy", f"{eval_metrics['accuracy']:.4f}"),
                ("eval macro-F1", f"{eval_metrics['macro_f1']:.4f}"),
                ("eval loss", f"{eval_metrics['loss']:.4f}"),
                ("train loss (last log)", f"{metrics['train_loss']:.4f}" if metrics["train_loss"] is not None else "-"),
                (
                    "optimizer steps",
                    f"{step:,}"
                    + (f" ({amp.skipped_steps} skipped: fp16 overflow)" if amp.skipped_steps else "")
                    + (f" ({progress.nan_skipped_steps} skipped: non-finite)" if progress.nan_skipped_steps else "")
                    + (f" (resumed at {resume_from.step:,})" if resume_from is not None else ""),
                ),
                ("samples/s (train)", f"{metrics['train_samples_per_second'] or 0:.1f}"),
                *(  # images and audio have no tokens
                    [
                        ("tokens/s (train, no padding)", f"{metrics['train_tokens_per_second']:.0f}"),
                        ("padding", f"{metrics['padding_fraction']:.1%}"),
                    ]
                    if metrics["padding_fraction"] is not None
                    else []
                ),
                (
                    "MFU (steady)",
                    f"{metrics['steady_mfu']:.1%} of {flop_peak.flops_per_second / 1e12:.3g} TFLOP/s"
                    if metrics["steady_mfu"] is not None
                    else "-",
                ),
                (
                    "peak memory over baseline",
                    f"{over_baseline * mb:.0f} MB" if over_baseline is not None else "-",
                ),
                ("optimizer state", f"{state_bytes * mb:.1f} MB"),
                ("wall time", f"{metrics['wall_seconds']:.1f} s"),
            ],
        ).rstrip()
    )
    say.info(f"written to {run.path}")  # on its own line: a table would fold a long path mid-name
    out = run.path
    return TrainResult(
        output_dir=out,
        model_dir=out / "model",
        metrics=metrics,
        paths={
            "model": out / "model",
            "metrics": out / "metrics.json",
            "log": out / "metrics.jsonl",
            "config": out / "config.yaml",
        },
    )


def _compile(model, loader, accelerator, amp, say):
    """torch.compile, then one untimed forward and backward so that compiling the training graphs is
    measured apart from throughput. The RNG is forked (dropout draws nothing from the run's stream) and
    the gradients are dropped, so the run trains exactly as it would have without this warm-up."""
    say.info("compiling the model (torch.compile) on one batch, forward and backward")
    started = time.perf_counter()
    compiled = torch.compile(model)
    batch = next(iter(loader))
    devices = [accelerator.device] if accelerator.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        with amp.autocast():
            loss = compiled(**model_inputs(batch)).logits.float().sum()
        loss.backward()
    model.zero_grad(set_to_none=True)
    return compiled, time.perf_counter() - started


def _quiet_transformers() -> None:
    """leantrain reports loading and saving itself; the libraries' own bars would interleave with ours."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _find_resume(cfg: TrainConfig, run, checkpoints, accelerator, say):
    """The checkpoint to resume, or None. A fresh run refuses a directory holding an unfinished run's
    checkpoints (--overwrite discards them); --resume auto with none found starts from scratch."""
    if accelerator.is_main_process:
        checkpoints.clean()  # saves and prunes cut short by a kill
    found = None
    if cfg.resume is None:
        newest = checkpoints.step_dirs()
        if newest and not cfg.overwrite:
            raise ConfigError(
                f"--output-dir: '{run.path}' holds checkpoints of an unfinished run (newest: "
                f"{newest[0].name}); pass --resume auto to continue it, or --overwrite to start over"
            )
        if newest and accelerator.is_main_process:
            say.info(f"--overwrite: discarding the checkpoints in {checkpoints.root}")
            checkpoints.discard_all()
    else:
        found = checkpoints.find(cfg.resume, run.path, warn=say.info)
        if found is None:
            say.info(f"--resume auto: no checkpoint in {checkpoints.root} yet; starting from scratch")
    accelerator.wait_for_everyone()
    return found


def _fingerprint(data) -> int:
    """A checksum of the training set's labels and token lengths: same file name, same data?"""
    import zlib

    import numpy as np

    return zlib.crc32(
        np.ascontiguousarray(data.labels, dtype=np.int64).tobytes()
        + np.ascontiguousarray(data.lengths, dtype=np.int64).tobytes()
    )


def _all_finite(accelerator, values: list[float]) -> bool:
    """Whether every value is finite on every process (one all-reduce when there are several)."""
    finite = all(math.isfinite(v) for v in values)
    if accelerator.num_processes > 1:
        flag = torch.tensor([0.0 if finite else 1.0], device=accelerator.device)
        finite = float(accelerator.reduce(flag, reduction="sum")) == 0.0
    return finite


def _nan_message(step: int, loss: float, grad_norm: float, lr: float, precision: str, saved: Path | None) -> str:
    what = (
        " and ".join(
            f"{name} ({value})"
            for name, value in (("loss", loss), ("gradient norm", grad_norm))
            if not math.isfinite(value)
        )
        or "loss or gradient norm on another process"
    )
    cause = (
        "fp16 overflow (values beyond fp16's range); start again with --precision bf16 (or fp32), or a lower --lr"
        if precision == "fp16"
        else f"the learning rate is too high (--lr {lr:g}); start again with a lower --lr"
    )
    kept = f" The last good state (step {step - 1}) is saved in {saved}." if saved is not None else ""
    return (
        f"step {step}: non-finite {what}. Likely cause: {cause}.{kept} To skip such steps instead: "
        "--on-nan skip (e.g. --resume auto --on-nan skip)"
    )


def _epoch_progress(step: int, steps_per_epoch: int) -> float:
    return ((step - 1) % max(steps_per_epoch, 1) + 1) / max(steps_per_epoch, 1)


def _gather_totals(accelerator, meter) -> dict[str, int]:
    t = torch.tensor(
        [meter.examples, meter.tokens, meter.padded_tokens], dtype=torch.float64, device=accelerator.device
    )
    t = accelerator.reduce(t, reduction="sum")
    return {"examples": int(t[0]), "tokens": int(t[1]), "padded": int(t[2])}


def _write_outputs(staging: Path, model, tokenizer, cfg: TrainConfig, metrics: dict[str, Any]) -> None:
    import json

    import yaml

    model.save_pretrained(staging / "model", safe_serialization=True)
    tokenizer.save_pretrained(staging / "model")
    (staging / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
