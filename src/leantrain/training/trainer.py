"""The trainer: build once, then fit -> train_step -> forward_backward_step, read top to bottom.

Building (task data and model, loaders, optimizer, schedule, Accelerate's `prepare`) is apart from stepping.
Components own their policy: the `Evaluator` when to evaluate, the `Checkpointer` when to save and what to
resume, the `MetricsLogger` what to count and log, the `NanGuard` and `OomGuard` what to do when a step goes
wrong. `TrainState` (one object, mutated in place) holds every counter; a checkpoint saves it whole.

Loss normalisation: each micro-batch contributes the task's summed loss / (units in the whole optimizer step,
across micro-batches and processes), which the sampler knows before the step begins. Summed over the step that
is exactly the mean loss of the global batch, however it was split; Accelerate's DDP averages gradients over N
processes, so the local loss is scaled by N to turn that average back into the sum.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from leantrain.config import TrainConfig
from leantrain.data.mixture import source_rows
from leantrain.errors import ConfigError, LeantrainError
from leantrain.run import checkpoint
from leantrain.run.checkpoint import TrainState
from leantrain.tasks.base import Task, TaskData
from leantrain.telemetry.profiler import StepProfiler
from leantrain.training.checkpointer import Checkpointer
from leantrain.training.early_stopping import EarlyStopping, resolve_metric, steps_every
from leantrain.training.evaluator import Evaluator, prefixed
from leantrain.training.guards import NanGuard
from leantrain.training.hooks import Hooks
from leantrain.training.metrics_logger import MetricsLogger


@dataclass
class TrainResult:
    """What `leantrain.train` returns."""

    output_dir: Path
    model_dir: Path
    metrics: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)


class Trainer:
    """One training run of `task` as `cfg` (resolved) says; `fit()` runs it and publishes the result."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        model_path: str,
        model_config: Any,
        *,
        plan=None,
        hooks: Hooks | None = None,
        share_output_dir: bool = False,
    ):
        from leantrain import parallel
        from leantrain.parallel import sharding
        from leantrain.parallel.precision import MixedPrecision
        from leantrain.run.directory import RunDir
        from leantrain.telemetry import Console

        self.task, self.plan, self.hooks = task, plan, hooks or Hooks()
        self.precision, self.precision_why = parallel.choose_precision(cfg.precision)
        self.accelerator = accelerator = parallel.make_accelerator(self.precision, cfg.shard, self._trackers(cfg))
        if share_output_dir:  # a timestamped default: every process writes under rank 0's
            cfg = cfg.replace(output_dir=parallel.broadcast_from_main(cfg.output_dir))
        best_metric = resolve_metric(cfg, task)  # the task's default when not given; refused if not reported
        cfg = cfg.replace(metric_for_best=best_metric)
        self.cfg = cfg
        assert cfg.output_dir is not None and cfg.cache_dir is not None  # resolved() filled them
        self.run = RunDir(cfg.output_dir, overwrite=cfg.overwrite)
        self.run.check()  # on every process, so each one fails with the message rather than waiting for the others
        # --shard fsdp on CPU processes: the model is sharded here, not prepared (and autocast) by Accelerate
        self.sharded = sharding.shards_here(cfg.shard, accelerator.device)
        self.amp = MixedPrecision(accelerator, self.precision, model_autocasts=not self.sharded)
        self.say = Console(enabled=accelerator.is_main_process)
        if plan is not None:
            self.say.info(plan.summary())
        parallel.seed_everything(cfg.seed)
        self.state = TrainState(best_metric=best_metric)
        self.checkpointer = Checkpointer(cfg, self.run, accelerator, self.say)
        self.resume_from = self.checkpointer.find_resume()  # refused now, before any work, if from another run
        if self.resume_from is not None:
            self.resume_from.check_matches(cfg.to_dict(), self._facts())
        self.data = task.prepare_data(model_path, model_config)
        self._build_model(model_path)
        self._build_loop_parts()

    @staticmethod
    def _trackers(cfg: TrainConfig) -> list[str]:
        """--report-to (and --log tensorboard): the trackers Accelerate starts."""
        from leantrain.parallel.trackers import check_trackers, tracker_names

        names = tracker_names(cfg.report_to, cfg.log)
        check_trackers(names)
        return names

    def _facts(self, data: TaskData | None = None) -> dict[str, Any]:
        facts = {"precision": self.precision, "num_processes": self.accelerator.num_processes}
        return {**facts, **self.task.data_facts(data)} if data is not None else facts

    def _build_model(self, model_path: str) -> None:
        from leantrain.model import loading

        for note in self.data.notes:
            self.say.info(note)
        if self.resume_from is not None:
            self.resume_from.check_matches({}, self.task.data_facts(self.data))
        self.model = self.task.build_model(model_path, self.data)
        self._choose_attention()
        if self.cfg.activation_checkpointing:
            loading.enable_activation_checkpointing(self.model)
        self.say.info(loading.describe(self.model))
        if self.cfg.lora:  # adapters (and the head) train, the rest is frozen
            from leantrain.model import lora

            self.model = lora.apply(self.model, self.cfg, self.accelerator.device)
            self.say.info(lora.describe(self.model, self.cfg))
        if self.sharded:  # before the optimizer, which then steps each process's shards
            from leantrain.parallel import sharding

            if self.accelerator.num_processes < 2:
                raise ConfigError("--shard fsdp shards across processes; give --num-processes 2 or more")
            if self.cfg.lora:
                raise ConfigError("--shard fsdp with --lora: not supported on CPU processes yet; use --shard none")
            sharding.shard(self.model)
            self.say.info(f"sharded with FSDP2 across {self.accelerator.num_processes} processes, one unit a layer")
        labels = f"labels: {', '.join(self.data.label_names)}; " if self.data.label_names else ""
        self.say.info(
            f"{labels}precision {self.precision} ({self.precision_why}); "
            f"device {self.accelerator.device}, {self.accelerator.num_processes} process(es)"
        )

    def _choose_attention(self) -> None:
        """--attention: the kernel, then the task's checks of the model as it will run."""
        from leantrain.model import attention

        name, why = attention.set_up(self.model, self.cfg.attention, self.accelerator.device.type, self.precision)
        if name is not None:
            self.say.info(f"attention: {name} ({why})")
        self.attention = name
        self.task.check_model(self.model)

    def _build_loop_parts(self) -> None:
        self._build_batches()
        self._build_optimization()
        self._build_components()

    def _build_batches(self) -> None:
        from torch.utils.data import DataLoader

        from leantrain.tasks.evaluation import eval_loader

        cfg, acc, data = self.cfg, self.accelerator, self.data
        # whole examples (GlobalBatchSampler) or a stream (--streaming): the same global batches either way
        self.sampler, train_set = data.train.batches(
            cfg.batch_size, cfg.grad_accum, acc.num_processes, cfg.seed, units=self.task.loss_units(data)
        )
        # Each loader has its own generator: iterating one then draws nothing from the global RNG, so dropout
        # does not depend on when epochs begin or evaluations run, and a resumed run's RNG lines up exactly.
        self.train_loader: Any = DataLoader(  # after prepare(), Accelerate's loader (it has set_epoch)
            train_set,
            batch_sampler=self.sampler,
            collate_fn=self.task.collator(data, train=True),
            generator=torch.Generator(),
            num_workers=cfg.dataloader_num_workers,
        )
        self.eval_loader = eval_loader(
            self.task, data, cfg.eval_batch_size or cfg.batch_size * 2, cfg.dataloader_num_workers
        )
        self.steps_per_epoch = self.sampler.steps_per_epoch()  # None: a stream's, unknown until it ends
        if self.steps_per_epoch == 0:
            raise ConfigError(f"--data: {len(data.train)} training rows cannot feed {acc.num_processes} processes")
        # (a stream has no steps per epoch; the config requires --max-steps with --streaming)
        self.total_steps = cfg.max_steps or max(1, math.ceil((self.steps_per_epoch or 0) * cfg.epochs))

    def _build_optimization(self) -> None:
        """Optimizer and schedule, Accelerate's placement, FLOP counting, compile and local SGD."""
        from leantrain.model.optimizers import build_optimizer, describe_split
        from leantrain.model.schedules import build_scheduler
        from leantrain.parallel.local_sgd import LocalSGD

        cfg = self.cfg
        optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg)
        if split := describe_split(self.model, cfg.optimizer):  # Muon's, GaLore's: which parameters get its rule
            self.say.info(split)
        scheduler = build_scheduler(
            optimizer, cfg.scheduler, self.total_steps, cfg.warmup_ratio, cfg.warmup_steps, cfg.scheduler_kwargs
        )
        if self.sharded:  # the model is FSDP2's already: Accelerate would wrap it in DDP
            self.optimizer, self.train_loader, self.eval_loader, self.scheduler = self.accelerator.prepare(
                optimizer, self.train_loader, self.eval_loader, scheduler
            )
        else:
            self.model, self.optimizer, self.train_loader, self.eval_loader, self.scheduler = self.accelerator.prepare(
                self.model, optimizer, self.train_loader, self.eval_loader, scheduler
            )
        self.flops, self.flop_peak = self._flop_meter()
        self.compile_seconds = self._compile() if cfg.compile else None
        self.local_sgd = LocalSGD(
            self.model,
            cfg.local_sgd_steps or 1,
            cfg.local_sgd_outer_lr,
            cfg.local_sgd_outer_momentum,
            enabled=cfg.local_sgd_steps is not None,
        )
        if cfg.local_sgd_steps is not None:
            self.say.info(self.local_sgd.reason)

    def _build_components(self) -> None:
        """The run directory's staging, resume, the log and the components that own the loop's policies."""
        from leantrain.training.oom import OomGuard

        cfg, acc = self.cfg, self.accelerator
        eval_every = steps_every(cfg.eval_every, self.steps_per_epoch)
        spans = getattr(self.data.eval, "spans", ())  # a mixture's sources: each scored on its own rows too
        self.evaluator = Evaluator(self.task, self.eval_loader, acc, eval_every, self.hooks, spans)
        self.early_stopping = EarlyStopping(cfg.early_stopping_patience, cfg.early_stopping_threshold, self.state)
        self.last_eval: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the latest evaluation
        self.checkpointer.schedule(self.steps_per_epoch)
        self.nan_guard = NanGuard(acc, cfg.on_nan, self.amp.scales_loss)
        self.staging = self.run.begin() if acc.is_main_process else None
        log_path = self.staging / "metrics.jsonl" if self.staging else None
        trained = dict(
            model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, amp=self.amp, local_sgd=self.local_sgd
        )
        self.checkpointer.attach(self._facts(self.data), log_path, self.data.processor, **trained)
        if self.staging is not None and self.plan is not None:
            self.plan.write(self.staging)  # plan.json and plan.md: what was predicted, and why this configuration
        self.resume_rng: dict | None = None  # set by a resume, applied just before the loop starts
        history = self._resume(log_path) if self.resume_from is not None else []
        if self.resume_from is None:
            self.checkpointer.warn_if_short_of_space(self.model)
        self.logger = MetricsLogger(
            cfg,
            acc,
            log=self._open_log(log_path),
            flops=self.flops,
            flop_peak=self.flop_peak,
            total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch or 0,
            state=self.state,
            sources=source_rows(self.data.train),
        )
        self.checkpointer.before_save = self.logger.gather_partial_sums
        self.logger.history.extend(history)
        self.profiler = StepProfiler(
            cfg.profile_steps, self.staging, self.state.step + 1, say=self.say.info, shown_dir=self.run.path
        )
        # the guard holds the run to the user's --memory; the plan aimed below it (planner.auto's margin)
        budget = cfg.memory_bytes or (self.plan.request.budget if self.plan is not None else None)
        from leantrain.telemetry.memory import tensor_bytes

        weights = tensor_bytes(acc.unwrap_model(self.model).parameters())
        self.oom = OomGuard(cfg.auto, self.sampler, acc, self.logger.memory, budget, weights, hooks=self.hooks)
        from leantrain.parallel.threads import thread_governor

        # fewer threads while other processes hold this machine's cores (a `leantrain` command's CPU run)
        self.thread_governor = thread_governor(acc.num_processes, cfg.dataloader_num_workers, acc.device.type)
        streamed = self.steps_per_epoch is None
        self.say.info(
            f"training {'streamed' if streamed else f'{len(self.data.train):,}'} examples for {self.total_steps:,} "
            f"optimizer steps (global batch {self.sampler.global_batch} = {cfg.batch_size} x {cfg.grad_accum} "
            f"accumulation x {acc.num_processes} processes"
            f"{'' if streamed else f'; {self.steps_per_epoch:,} steps per epoch'}); writing {self.run.path}"
        )

    def _resume(self, log_path: Path | None) -> list[dict[str, Any]]:
        """Restore the checkpoint into the trained objects and the state; seek the sampler; return the log so far."""
        ckpt = self.resume_from
        assert ckpt is not None
        self.resume_rng = self.checkpointer.restore(ckpt, self.state)
        history = []
        if log_path is not None:
            history = [r for r in checkpoint.restore_log(ckpt, log_path) if "loss" in r]
        state = self.state
        self.sampler.start_at(state.epoch, state.steps_in_epoch)  # a seek: the skipped batches are never built
        self.say.info(
            f"resuming from {ckpt.path}: step {state.step}, {state.steps_in_epoch} steps into epoch {state.epoch + 1}"
        )
        return history

    def _open_log(self, log_path: Path | None):
        from leantrain.parallel.trackers import start_trackers
        from leantrain.run.report import write_environment
        from leantrain.telemetry import MetricsLog, TeeLog

        trackers = None
        if self.staging is not None:
            acc = self.accelerator
            write_environment(self.staging, device=acc.device, peak=self.flop_peak, num_processes=acc.num_processes)
            if acc.log_with:  # --report-to: TensorBoard, W&B, MLflow through Accelerate
                trackers = start_trackers(acc, self.staging / "trackers", self.cfg.to_dict(), self.run.path.name)
        return TeeLog(MetricsLog(log_path), trackers)

    def _flop_meter(self):
        from leantrain.telemetry.flops import FlopMeter, flop_model
        from leantrain.telemetry.peak import device_peak

        model = self.accelerator.unwrap_model(self.model)
        counted = flop_model(model, self.task.flop_input_shapes(self.data))
        tail = self.task.tail_flops(model)  # the part `task.forward` may run on fewer rows than tokens
        if tail:
            counted = replace(counted, tail_per_row=tail)
        flops = FlopMeter(counted)
        peak = device_peak(self.accelerator.device, self.precision)  # CPU: a ~1 s GEMM probe the first time, cached
        flops.peak = peak.flops_per_second
        length = self.cfg.max_length // 2
        per = (
            f"{flops.model.per_padded_token(length) / 1e6:.1f} MFLOP per token at length {length}"
            if flops.model.per_token
            else f"{flops.model.per_sequence / 1e6:.1f} MFLOP per example"
        )
        self.say.info(f"{per} ({flops.model.source}); peak {peak.flops_per_second / 1e12:.3g} TFLOP/s ({peak.source})")
        return flops, peak

    def _compile(self) -> float:
        """torch.compile, then one untimed forward and backward so that compiling the training graphs is
        measured apart from throughput. The RNG is forked (dropout draws nothing from the run's stream) and
        the gradients are dropped, so the run trains exactly as it would have without this warm-up."""
        self.say.info("compiling the model (torch.compile) on one batch, forward and backward")
        started = time.perf_counter()
        compiled = torch.compile(self.model)
        batch = next(iter(self.train_loader))
        self.model.train()  # the training graph (dropout on) is the one to compile; from_pretrained gives eval mode
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            with self.amp.autocast():
                loss = self.task.loss_sum(compiled(**self.task.model_inputs(batch)), batch)
            loss.backward()
        self.model.zero_grad(set_to_none=True)
        self.model = compiled  # type: ignore[assignment]  # an OptimizedModule behaves as the module
        return time.perf_counter() - started

    # -- the loop ----------------------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train to the last step, evaluating and saving as the components decide; then publish the run."""
        from leantrain.model.optimizers import use_weights

        state, logger = self.state, self.logger
        self.model.train()
        use_weights(self.cfg.optimizer, self.optimizer, "train")  # schedule-free: its training weights, also on resume
        logger.start(self.model)
        if self.resume_rng is not None:
            checkpoint.set_rng_state(self.resume_rng)  # last, so that nothing above moves it
        try:
            with self.local_sgd:
                while state.step < self.total_steps:
                    # Accelerate's loader hands the sampler its own count of passes: set both to this epoch.
                    self.sampler.set_epoch(state.epoch)
                    self.train_loader.set_epoch(state.epoch)
                    for batches in self._optimizer_steps():
                        if not self.train_step(batches):
                            continue  # out of memory (--auto): the step is redone with smaller micro-batches
                        self.profiler.after_step(state.step)
                        self._govern_threads()
                        new_best = self._maybe_evaluate()
                        saved = self.checkpointer.should_save(state.step, new_best)
                        if saved:
                            with logger.paused(), logger.timer.phase("checkpoint"):
                                self.checkpointer.maybe_save(self._now(), new_best)
                        self._stop_if_interrupted(saved)
                        if state.step >= self.total_steps or self.early_stopping.reason:
                            break
                    if self.early_stopping.reason:
                        self.say.info(self.early_stopping.reason)
                        break
                    state.epoch += 1
                    state.steps_in_epoch = 0
        finally:
            logger.meter.pause()
            logger.bar.close()
            self.profiler.close()
        return self._finish()

    def _govern_threads(self) -> None:
        governor = self.thread_governor
        if governor is not None and (threads := governor.update()) is not None:
            self.say.info(
                f"step {self.state.step}: {threads} of {governor.most} CPU threads (other processes used "
                f"{governor.others:.1f} cores over the last {governor.interval:.0f} s)"
            )

    def _stop_if_interrupted(self, saved_now: bool) -> None:
        """Ctrl-C or SIGTERM (noted by the CLI's handlers): every process stops here, after a checkpoint."""
        from leantrain.training import interrupt

        signum = interrupt.requested(self.accelerator)
        if signum is not None:
            state, cp = self.state, self.checkpointer
            save = lambda why: cp.save(self._now(), why, checkpoint.rng_state())  # noqa: E731
            raise interrupt.stop(signum, self.cfg, state.step, self.total_steps, cp.dir, saved_now, save)

    def _optimizer_steps(self):
        """The micro-batches of each optimizer step on this process (the last one carries `step_end`)."""
        batches: list[dict[str, Any]] = []
        for batch in self.logger.timer.timed(self.oom.batches(self.train_loader)):  # the wait for each is "data"
            batches.append(batch)
            if bool(batch["step_end"]):
                yield batches
                batches = []

    def train_step(self, batches: list[dict[str, Any]]) -> bool:
        """One optimizer step: forward and backward each micro-batch, then check, clip, step and schedule.
        Returns False when a micro-batch ran out of memory (--auto) and the step must be redone."""
        state, timer = self.state, self.logger.timer
        rng, micro_step = checkpoint.rng_state(), state.micro_step  # what a NaN stop rolls back to
        loss_sum, units = 0.0, 0.0
        self.logger.step_started()
        for i, batch in enumerate(batches):
            # Gradients are all-reduced once per optimizer step, never with local SGD.
            last = i == len(batches) - 1
            sync = self.local_sgd.no_sync() if self.local_sgd.enabled else self._no_sync_unless(last)
            self.hooks.on_micro_batch(self.model, batch)
            with sync, timer.phase("forward_backward"):
                loss = self.oom.forward_backward(self.forward_backward_step, batch, state.step)
            if loss is None:  # out of memory on some process: redo this step, micro-batch halved
                event = self.oom.recut(self.optimizer, state.epoch, state.steps_in_epoch, state.step)
                state.micro_step = micro_step
                self.say.info(f"step {state.step + 1}: out of memory; {self.oom.describe(event)}")
                return False
            state.micro_step += 1
            loss_sum += float(loss)
            units += float(batch["units"])
            self.logger.micro_batch(batch, self.task)
        self.hooks.before_optimizer_step(state.step + 1)
        with timer.phase("optimizer"):
            grad_norm, finite = self._close_step(loss_sum / units)
        if not finite and self.cfg.on_nan == "stop":
            self._stop_on_nan(loss_sum / units, grad_norm, rng, micro_step)
        state.step += 1
        state.steps_in_epoch += 1
        with timer.phase("comm"):  # local SGD's parameter averaging, every --local-sgd-steps
            self.local_sgd.step()
        self.logger.step_done(finite)
        if finite:
            state.logged_loss += loss_sum
            state.logged_units += units
        else:
            state.nan_skipped_steps += 1
            self.say.info(f"step {state.step}: non-finite loss or gradient norm; step skipped (--on-nan skip)")
        self.logger.maybe_log(state, grad_norm, self.scheduler.get_last_lr()[0], self.amp)
        return True

    def forward_backward_step(self, batch: dict[str, Any]) -> torch.Tensor:
        """One micro-batch: forward, the step-normalised loss, backward. Returns the summed loss (detached)."""
        with self.amp.autocast():
            outputs = self.task.forward(self.model, batch)
        loss_sum = self.task.loss_sum(outputs, batch)
        if "source" in batch:  # a mixture's batch: the loss of each source's rows, for the log
            self.logger.row_losses(self.task, outputs, batch)
        self.amp.backward(loss_sum * self.accelerator.num_processes / batch["step_units"])
        return loss_sum.detach()

    def _no_sync_unless(self, last: bool):
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.model)

    def _close_step(self, step_loss: float) -> tuple[float, bool]:
        """Unscale and clip, check (the NaN guard), step, schedule, clear. Returns (pre-clip norm, finite).
        A non-finite step is dropped under --on-nan skip (the schedule moves on) and left untouched under stop,
        so that the state before it can be saved."""
        grad_norm = self.amp.unscale_and_clip(self.model, self.optimizer, self.cfg.max_grad_norm)
        finite = self.nan_guard.finite(step_loss, grad_norm)
        if not finite and self.cfg.on_nan == "stop":
            return grad_norm, False
        if finite:
            self.amp.step(self.optimizer)
        else:
            self.amp.drop_step(self.optimizer)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, finite

    def _stop_on_nan(self, loss: float, grad_norm: float, rng: dict, micro_step: int) -> None:
        """Nothing has moved yet: save the state before this step (unless saved already), then stop."""
        state = self.state
        saved = self.checkpointer.saved(state.step)
        if state.step > 0 and not saved.is_dir():
            saved = self.checkpointer.save(
                self._now(), "last good state before a non-finite step", rng, micro_step=micro_step
            )
        self.logger.close()
        message = self.nan_guard.message(
            state.step + 1, loss, grad_norm, self.cfg.lr, self.precision, saved if saved.is_dir() else None
        )
        raise LeantrainError(message)

    def _maybe_evaluate(self) -> bool:
        """A mid-run evaluation when the evaluator says so; True when it is the best so far."""
        state, logger = self.state, self.logger
        if not self.evaluator.should_evaluate(state.step, self.total_steps):
            return False
        from leantrain.model.optimizers import evaluation_weights

        with logger.paused(), logger.timer.phase("eval"):
            with logger.timer.phase("comm"):
                self.local_sgd.sync()  # evaluate the averaged model, as the final one will be
            with evaluation_weights(self.cfg.optimizer, self.optimizer):  # schedule-free: its averaged weights
                metrics = self.evaluator.evaluate(self.model)
        logger.eval_row(state.step, metrics, self.evaluator.by_source)
        self.say.info(f"step {state.step}: " + ", ".join(f"eval {k} {v:.4f}" for k, v in metrics.items()))
        for name, scores in self.evaluator.by_source.items():
            self.say.info(f"step {state.step}: {name}: " + ", ".join(f"eval {k} {v:.4f}" for k, v in scores.items()))
        self.model.train()
        self.last_eval = (state.step, metrics)
        new_best = state.update_best(metrics, state.step)
        self.early_stopping.observe(metrics, state.step)
        return new_best

    def _now(self) -> TrainState:
        """The state with its clock brought up to date (what a checkpoint records)."""
        self.state.elapsed_seconds = self.logger.elapsed()
        return self.state

    # -- the end -----------------------------------------------------------------------------------------------
    def _finish(self) -> TrainResult:
        """The final evaluation, metrics.json, the model and its processor, the report; then publish atomically."""
        from leantrain.model.optimizers import use_weights
        from leantrain.telemetry.peak import distrust

        logger, acc = self.logger, self.accelerator
        use_weights(self.cfg.optimizer, self.optimizer, "eval")  # schedule-free: its average is evaluated and published
        peak = logger.memory.report()
        eval_metrics, model_step = self._final_evaluation()
        logger.close()
        unwrapped = acc.unwrap_model(self.model)
        extra = {
            "eval": prefixed(eval_metrics),
            "resumed_from": str(self.resume_from.path) if self.resume_from is not None else None,
            "best_checkpoint": str(best) if (best := self.checkpointer.best()) else None,
            "compile_seconds": self.compile_seconds,
            "peak": peak,
            "local_sgd": {
                "local_sgd_syncs": self.local_sgd.num_syncs if self.local_sgd.enabled else None,
                "local_sgd_bytes_communicated": self.local_sgd.bytes_communicated if self.local_sgd.enabled else None,
            },
            "precision": self.precision,
            "attention": self.attention,
            "global_batch": self.sampler.global_batch,
            "oom": self.oom.metrics() if self.cfg.auto else {},
            "num_labels": len(self.data.label_names),
            "sources": self._sources_of_run(),
            "best_and_stopping": {  # HF Trainer users; metrics.json stays flat
                "best_metric": self.state.best_metric,
                "best_value": self.state.best_value,
                "best_step": self.state.best_step,
                "model_step": model_step,
                **self.early_stopping.summary(),
            },
        }
        metrics = logger.final_metrics(self.state, unwrapped, self.optimizer, self.amp, extra)
        best_mfu = max(metrics["mfu"] or 0.0, metrics["steady_mfu"] or 0.0)
        if best_mfu > 1 and distrust(self.flop_peak, self.flop_peak.flops_per_second * best_mfu):
            self.say.info(
                "warning: this run beat the cached peak FLOP/s (MFU above 100%); the next runs probe it again"
            )
        acc.wait_for_everyone()
        from leantrain.parallel import sharding

        state_dict = None
        # sharded here (CPU) or by Accelerate's FSDP plugin (GPUs): gathered whole on the main process; every process
        # takes part, or the gather waits for ever
        if sharding.is_sharded(self.model):
            state_dict = sharding.full_state_dict(self.model)
        if acc.is_main_process:
            self._publish(unwrapped, metrics, state_dict)
        acc.wait_for_everyone()
        resumed = self.resume_from.step if self.resume_from is not None else None
        self.say.info(logger.summary(metrics, self.task.summary_rows(eval_metrics), resumed))
        self.say.info(f"written to {self.run.path}")  # on its own line: a table would fold a long path mid-name
        out = self.run.path
        paths = {"model": out / "model", "metrics": out / "metrics.json", "log": out / "metrics.jsonl"}
        return TrainResult(out, out / "model", metrics, {**paths, "config": out / "config.yaml"})

    def _final_evaluation(self) -> tuple[dict[str, float], int]:
        """Evaluate the last step's model (unless it was just evaluated: early stopping); with
        --load-best-at-end, put the best evaluation's weights in its place and score those. Returns the
        metrics of the model to publish and the step its weights come from."""
        state, logger = self.state, self.logger
        if self.last_eval is not None and self.last_eval[0] == state.step:
            metrics = self.last_eval[1]
        else:
            with logger.timer.phase("eval"):
                metrics = self.evaluator.evaluate(self.model)
            logger.eval_row(state.step, metrics, self.evaluator.by_source)
            if self.cfg.load_best_at_end:
                state.update_best(metrics, state.step)
        if not self.cfg.load_best_at_end or state.best_step in (None, state.step):
            return metrics, state.step
        path = self.checkpointer.load_best_weights(state)
        self.say.info(f"--load-best-at-end: publishing step {state.best_step}'s weights ({path})")
        with logger.timer.phase("eval"):
            return self.evaluator.evaluate(self.model), state.best_step

    def _sources_of_run(self) -> dict[str, dict[str, Any]]:
        """A mixture's sources as the data found them, each with its latest evaluation (`eval_` keys)."""
        by_source = self.evaluator.by_source
        return {name: {**facts, "eval": prefixed(by_source.get(name, {}))} for name, facts in self.data.sources.items()}

    def resolved_config(self) -> dict[str, Any]:
        """The config as it ran: `auto` precision as what it resolved to, the task's metric, the eval batch size."""
        from leantrain.config import resolved_values

        cfg, acc = self.cfg, self.accelerator
        metric = cfg.metric_for_best or self.state.best_metric
        from leantrain.tasks.registry import recorded_name

        return resolved_values(
            cfg, precision=self.precision, metric_for_best=metric, num_processes=acc.num_processes,
            task=recorded_name(type(self.task)),
        )  # fmt: skip

    def _publish(self, model, metrics: dict[str, Any], state_dict: dict[str, Any] | None = None) -> None:
        import json

        from leantrain.config.saved import write_run_config
        from leantrain.model.lora import ADAPTER_DIR, for_publishing
        from leantrain.run import directory
        from leantrain.run.model_card import write_model_card
        from leantrain.run.report import write_report

        staging = self.staging
        assert staging is not None  # the main process stages the run
        # LoRA: model/ is the merged model (the adapter alone in adapter/ with --save-adapter); else `model` itself
        model = for_publishing(model, staging / ADAPTER_DIR if self.cfg.save_adapter else None)
        with directory.writing(staging / "model", metrics["weights_bytes"]):  # a full disk: one line, nothing left
            model.save_pretrained(staging / "model", safe_serialization=True, state_dict=state_dict)
            self.data.processor.save_pretrained(staging / "model")
        cfg = self.cfg
        data = {"train": cfg.data, "eval": cfg.eval_data}
        write_model_card(
            staging / "model",
            base_model=cfg.model,
            data=data,
            metrics=metrics,
            config=self.resolved_config(),
            task=self.task.pipeline or self.task.name,  # the pipeline its model serves
        )
        write_run_config(staging, self.resolved_config())
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        if self.cfg.report:
            try:
                write_report(staging)
            except Exception as exc:  # a plot must never fail a finished run
                self.say.info(f"warning: report.html not written ({type(exc).__name__}: {exc})")
        self.run.publish()
