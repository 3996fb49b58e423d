"""What a run reports as it goes and at the end: the per-step log, throughput, MFU, memory and the summary.

It owns every meter, so the trainer only says what happened (a micro-batch, a step, an evaluation) and
this component decides what to count, when to write a row and what the final metrics hold.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from leantrain.run.checkpoint import TrainState
from leantrain.tasks.base import Task
from leantrain.training.evaluator import prefixed


class MetricsLogger:
    def __init__(
        self,
        cfg,
        accelerator,
        *,
        log,
        flops,
        flop_peak,
        total_steps: int,
        steps_per_epoch: int,
        state,
        sources: dict[str, int] | None = None,
        task=None,
        say=None,
        graphs_before: int = 0,
    ):
        """`sources`: a mixture's sources, each with its training rows (0: a stream's, unknown); `task`: whose
        `train_sums` are logged (`train_metrics`) and whose `training_facts` go to metrics.json; `say`: where a
        line for the user goes; `graphs_before`: the graphs dynamo had compiled in this process before the run's."""
        from tqdm.auto import tqdm

        from leantrain.telemetry import Throughput
        from leantrain.telemetry.memory import MemoryMeter
        from leantrain.telemetry.timing import StepTimer
        from leantrain.training.sources import SourceMeter

        self.cfg, self.accelerator, self.log, self.flops, self.flop_peak = cfg, accelerator, log, flops, flop_peak
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.task = task
        self.every = cfg.log_every
        sync = (lambda: torch.cuda.synchronize(accelerator.device)) if accelerator.device.type == "cuda" else None
        self.meter = Throughput(warmup_steps=min(10, max(1, total_steps // 10)), sync=sync)
        self.memory = MemoryMeter(accelerator.device)
        # CUDA is synchronised only when the timer is read (a log row): a sync at every phase boundary would make
        # the GPU wait for the host each step; the phases then hold the host's time of launching their work
        self.timer = StepTimer(accelerator.device, sync=False, sync_on_read=True)
        self.say = say or (lambda line: None)
        self.graphs_before = graphs_before
        # the log window on the device, added to without a host read: [loss, units, non-finite steps skipped]
        dtype = torch.float32 if accelerator.device.type == "mps" else torch.float64  # MPS has no float64
        self.window = torch.zeros(3, dtype=dtype, device=accelerator.device)
        self.task_window: dict[tuple[str, ...], torch.Tensor] = {}
        self.history: list[dict[str, Any]] = []  # metrics.jsonl rows of training steps
        self.last_grad_norm: Any = None
        # --compile: a step in which dynamo compiles a new graph (a new batch shape) is compile time, not training
        self.recompiles, self.recompile_seconds = 0, 0.0
        self._step_start: tuple[Any, Any, int] | None = None
        self.bar = tqdm(disable=True)  # the real bar from `start`, below the lines that announce the run
        self._shows_bar = cfg.progress and accelerator.is_main_process
        self._first_step = min(state.step, total_steps)
        self.started = time.perf_counter() - state.elapsed_seconds
        self.sources = SourceMeter(list(sources), list(sources.values()), accelerator, state) if sources else None

    def start(self, model) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=self.total_steps, initial=self._first_step, desc="train", unit="step", disable=not self._shows_bar,
            dynamic_ncols=True,
        )  # fmt: skip
        self.memory.start(resident=model.parameters())  # weights paged in first: the peak over it is training's
        self.meter.start()
        self.timer.start()

    def resize(self, total_steps: int) -> None:
        """The run's last step moved (--max-time): the last log row and the progress bar end there."""
        self.total_steps = total_steps
        if (bar := getattr(self, "bar", None)) is not None:
            bar.total = total_steps
            bar.refresh()

    @contextlib.contextmanager
    def paused(self):
        """Evaluation and saving are not training time."""
        self.meter.pause()
        try:
            yield
        finally:
            self.meter.start()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # -- as training goes -------------------------------------------------------------------------------------
    def micro_batch(self, batch: dict[str, Any], task: Task, facts=None) -> None:
        """Count a micro-batch from its `BatchFacts` (read on the host while collating: no sync)."""
        from leantrain.data.batching import facts as facts_of

        facts = facts or facts_of(batch, task.tail_rows)
        self.meter.add(facts.rows, facts.num_tokens, facts.padded_tokens)
        inputs = task.model_inputs(batch)
        main = next(v for k, v in inputs.items() if k != "attention_mask")
        # packed rows: attention per document; tail rows: the model's tail only where `task.forward` ran it; an
        # encoder-decoder's targets (`target_mask`)
        mask, positions, targets = (batch.get(k) for k in ("attention_mask", "position_ids", "target_mask"))
        self.flops.add(main, mask, positions, facts.tail_rows, targets)

    def row_losses(self, task: Task, outputs: Any, batch: dict[str, Any]) -> None:
        """A mixture's micro-batch: its rows' losses, units and tokens, by source."""
        if self.sources is not None:
            self.sources.add(task.row_losses(outputs, batch), batch)

    def step_started(self) -> None:
        if self.sources is not None:
            self.sources.step_started()
        if self.cfg.compile:
            self._step_start = (self.meter.snapshot(), self.flops.snapshot(), compiled_graphs())

    def step_done(self, taken: Any = True) -> None:
        """`taken`: whether the step moved the weights (a device bool the host does not read, or a bool)."""
        if self.sources is not None:
            self.sources.step_done(taken, counted=None if self.cfg.on_nan == "skip" else taken)
        if self._step_start is not None and compiled_graphs() > self._step_start[2]:
            self.recompiles += 1
            self.recompile_seconds += self.meter.discard(self._step_start[0])
            self.flops.discard(self._step_start[1])
        self.meter.step_done()
        if self.meter.steps == self.meter.warmup_steps:
            self.flops.mark()
        self.bar.update(1)

    def add_step(self, loss: Any, units: float, taken: Any, sums: list[dict[str, torch.Tensor]], skip: bool) -> None:
        """A finished step's summed loss, its units and the task's `train_sums` (one dict per micro-batch) into the
        log window, on the device: a step not taken adds nothing but, under --on-nan skip, its count."""
        taken = torch.as_tensor(taken, device=self.window.device)
        step = torch.stack([torch.as_tensor(loss, dtype=self.window.dtype, device=self.window.device).reshape(()),
                            torch.tensor(units, dtype=self.window.dtype, device=self.window.device)])  # fmt: skip
        self.window[:2] += torch.where(taken, step, torch.zeros_like(step))
        if skip:
            self.window[2] += (~taken).to(self.window.dtype)
        if sums:
            keys = sorted(sums[0])
            totals = torch.stack([torch.stack([m[k].to(self.window.dtype) for k in keys]) for m in sums]).sum(0)
            totals = torch.where(taken, totals, torch.zeros_like(totals))
            self.task_window[tuple(keys)] = self.task_window.get(tuple(keys), 0) + totals

    def fold(self, state: TrainState) -> None:
        """The device window into the state's sums (one host read): at log rows, before saving, at the end."""
        keys = list(self.task_window)
        values = torch.cat([self.window, *(self.task_window[k] for k in keys)]).tolist()
        loss, units, skipped = values[:3]
        state.logged_loss += loss
        state.logged_units += units
        if skipped:
            state.nan_skipped_steps += int(skipped)
            self.say(f"step {state.step}: {int(skipped)} non-finite step(s) skipped since the last log (--on-nan skip)")
        at = 3
        for names in keys:
            for name in names:
                state.logged_sums[name] = state.logged_sums.get(name, 0.0) + values[at]
                at += 1
        self.window.zero_()
        self.task_window.clear()

    def _task_metrics(self, state: TrainState) -> dict[str, float]:
        """The task's logged metrics over the window, its sums added up across processes."""
        if self.task is None or not state.logged_sums:
            return {}
        keys = sorted(state.logged_sums)
        sums = [state.logged_sums[k] for k in keys]
        if self.accelerator.num_processes > 1:
            t = torch.tensor(sums, dtype=torch.float64, device=self.accelerator.device)
            sums = self.accelerator.reduce(t, reduction="sum").tolist()
        state.logged_sums = {}
        return self.task.train_metrics(dict(zip(keys, sums)))

    def logs_at(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total_steps

    def _compile_facts(self, warm_up_seconds: float | None) -> dict[str, float | int | None]:
        """metrics.json: the seconds spent compiling (the warm-up's `warm_up_seconds` and every later recompilation:
        their steps are left out of throughput), the steps that compiled a new graph after the warm-up, and the graphs
        compiled in all; None each when nothing compiled."""
        if warm_up_seconds is None:
            return dict.fromkeys(("compile_seconds", "recompiles", "compiled_graphs"))
        return {
            "compile_seconds": warm_up_seconds + self.recompile_seconds,
            "recompiles": self.recompiles,
            **self._compile_row(),
        }

    def _compile_row(self) -> dict[str, int]:
        """--compile: the graphs dynamo has compiled so far (a new one mid-run is a recompile)."""
        return {"compiled_graphs": compiled_graphs() - self.graphs_before} if self.cfg.compile else {}

    def maybe_log(self, state: TrainState, grad_norm: Any, lr: float, amp, *, force: bool = False) -> None:
        """Every --log-every steps (and at the last, or where `force` says the run stops): a metrics.jsonl row for
        the global batch's mean loss."""
        self.last_grad_norm = grad_norm  # the latest step's, for a row an early stop forces
        if not (force or self.logs_at(state.step)):
            return
        self.fold(state)
        loss, units = state.logged_loss, state.logged_units
        if self.accelerator.num_processes > 1:  # the global batch's loss, not this process's share
            sums = torch.tensor([loss, units], dtype=torch.float64, device=self.accelerator.device)
            loss, units = self.accelerator.reduce(sums, reduction="sum").tolist()
        n = self.accelerator.num_processes
        # an epoch's share done; a stream's epochs have unknown length (0): whole passes only
        spe = self.steps_per_epoch
        done = ((state.step - 1) % spe + 1) / spe if spe else 0.0
        row = {
            "step": state.step,
            "micro_step": state.micro_step,
            "epoch": state.epoch + done,
            "loss": loss / units if units else None,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "skipped_steps": amp.skipped_steps,
            "loss_scale": amp.loss_scale,  # fp16 only (None otherwise)
            "nan_skipped_steps": state.nan_skipped_steps,
            "samples_per_second": self.meter.samples_per_second * n,
            "tokens_per_second": self.meter.tokens_per_second * n,
            "elapsed_seconds": self.elapsed(),
            **self.flops.metrics(self.meter.elapsed()),
            **self.timer.window_row(),
            "peak_memory_bytes": self.memory.report()["peak_memory_bytes"],
            **self._task_metrics(state),
            **self._compile_row(),
        }
        if self.sources is not None:
            row["sources"] = self.sources.log_row(state)
        self.log.write(row)
        self.history.append(row)
        wall = row["time_wall_seconds"] or 1.0
        shown = dict(
            loss=f"{row['loss'] if row['loss'] is not None else float('nan'):.4f}",
            lr=f"{row['lr']:.2e}",
            sps=f"{row['samples_per_second']:.1f}",
            mfu=f"{row['mfu']:.1%}" if row["mfu"] is not None else "-",
            data=f"{row['time_data_seconds'] / wall:.0%}",
        )
        if row["time_generate_seconds"]:  # a task that generates its examples: generation against training
            shown.update(
                gen=f"{row['time_generate_seconds'] / wall:.0%}",
                train=f"{row['time_forward_backward_seconds'] / wall:.0%}",
            )
        for key in getattr(self.task, "shown_while_training", ()):  # what the task's users watch go up
            if isinstance(row.get(key), float):
                shown[key] = f"{row[key]:.3f}"
        self.bar.set_postfix(**shown)
        state.logged_loss, state.logged_units = 0.0, 0.0

    def eval_row(self, step: int, metrics: dict[str, float], by_source: dict[str, Any] | None = None) -> None:
        row: dict[str, Any] = {"step": step, **prefixed(metrics)}
        if by_source:
            row["sources"] = {name: prefixed(m) for name, m in by_source.items()}
        self.log.write(row)

    def gather_partial_sums(self, state: TrainState) -> None:
        """Before a checkpoint, on every process: the sums of the log row in progress, the whole job's, held by the
        main process (the others hold none), so that a resumed run's next row is the one left alone."""
        self.fold(state)
        sums = [state.logged_loss, state.logged_units, *(self.sources.partial_sums() if self.sources else [])]
        acc = self.accelerator
        if acc.num_processes > 1:
            total = acc.reduce(torch.tensor(sums, dtype=torch.float64, device=acc.device), reduction="sum").tolist()
            sums = total if acc.is_main_process else [0.0] * len(sums)
        state.logged_loss, state.logged_units = sums[0], sums[1]
        if self.sources is not None:
            self.sources.set_partial_sums(sums[2:])
            state.source_window = sums[2:]

    def close(self) -> None:
        self.bar.close()
        self.log.close()

    # -- at the end -------------------------------------------------------------------------------------------
    def final_metrics(self, state: TrainState, model, optimizer, amp, extra: dict[str, Any]) -> dict[str, Any]:
        """metrics.json: training figures of every process added up; memory and state sizes of this one."""
        from leantrain.model.optimizers import state_bytes as optimizer_state
        from leantrain.telemetry.memory import tensor_bytes

        meter, flops, n = self.meter, self.flops, self.accelerator.num_processes
        t = torch.tensor(
            [meter.examples, meter.tokens, meter.padded_tokens], dtype=torch.float64, device=self.accelerator.device
        )
        examples, tokens, padded = (int(x) for x in self.accelerator.reduce(t, reduction="sum"))
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        state_bytes = optimizer_state(optimizer)
        return {
            **extra["eval"],
            "train_loss": self.history[-1]["loss"] if self.history else None,
            "optimizer_steps": state.step,
            "micro_steps": state.micro_step,
            "epochs": state.step / self.steps_per_epoch if self.steps_per_epoch else None,  # a stream: unknown
            "skipped_steps": amp.skipped_steps,
            "loss_scale": amp.loss_scale,  # fp16 only (None otherwise)
            "nan_skipped_steps": state.nan_skipped_steps,
            "resumed_from": extra["resumed_from"],
            # --max-time: its seconds, each sizing as [step, last step], the readings
            "time_budget": {"seconds": self.cfg.max_time_seconds, **state.time_budget} if self.cfg.max_time else None,
            "best_checkpoint": extra["best_checkpoint"],
            "train_examples": examples,
            "train_seconds": meter.seconds,
            "train_samples_per_second": examples / meter.seconds if meter.seconds else None,
            "train_tokens_per_second": tokens / meter.seconds if meter.seconds and padded else None,
            "steady_samples_per_second": meter.steady_samples_per_second * n,
            "steady_tokens_per_second": meter.steady_tokens_per_second * n if padded else None,
            "padding_fraction": 1 - tokens / padded if padded else None,  # None: no tokens (images, audio)
            **self._compile_facts(extra["compile_seconds"]),
            **flops.metrics(meter.seconds),  # this process's FLOPs over its training time, against one device's peak
            **flops.steady_metrics(meter.steady_seconds),  # the same after the warm-up steps: the headline MFU
            "flops_per_padded_token": flops.flops / padded * n if padded else None,
            "peak_tflops": self.flop_peak.flops_per_second / 1e12,
            "peak_source": self.flop_peak.source,
            "flop_model": flops.model.source,
            **self.timer.total_row(),
            "wall_seconds": self.elapsed(),
            **extra["peak"],
            "weights_bytes": tensor_bytes(params),
            "gradients_bytes": tensor_bytes(trainable),
            "optimizer_state_bytes": state_bytes,
            "optimizer_state_bytes_per_param": state_bytes / max(sum(p.numel() for p in trainable), 1),
            **extra["local_sgd"],
            "precision": extra["precision"],
            "attention": extra["attention"],  # the kernel that trained (--attention auto resolved)
            "eval_attention": extra["eval_attention"],  # the kernel evaluations ran
            "num_processes": n,
            "global_batch": extra["global_batch"],
            **extra["oom"],
            "num_labels": extra["num_labels"],
            **extra.get("best_and_stopping", {}),  # best model, early stopping
            **(self.task.training_facts() if self.task is not None else {}),  # the task's own costs
            **({"sources": self.source_metrics(state, extra["sources"])} if self.sources is not None else {}),
        }

    def source_metrics(self, state: TrainState, given: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """metrics.json's `sources.<name>`: what was asked of each source and found in it, the examples and tokens
        drawn (realised shares), its last logged training loss and its evaluation (`eval_` keys)."""
        assert self.sources is not None
        last: dict[str, Any] = {}  # each source's latest logged loss (a window may have held none of its rows)
        for r in self.history:
            last.update({n: v["loss"] for n, v in (r.get("sources") or {}).items() if v.get("loss") is not None})
        out = {}
        for name, realised in self.sources.totals(state).items():
            row = {**given.get(name, {}), **realised, "train_loss": last.get(name)}
            out[name] = {**row, **given.get(name, {}).get("eval", {})}
            out[name].pop("eval", None)
        return out

    def summary(self, metrics: dict[str, Any], eval_rows: list[tuple[str, str]], resumed_step: int | None) -> str:
        from leantrain.telemetry import summary_table

        mb = 1 / 2**20
        over = metrics.get("peak_memory_over_baseline_bytes")
        steps = f"{metrics['optimizer_steps']:,}"
        if metrics["skipped_steps"]:
            steps += f" ({metrics['skipped_steps']} skipped: fp16 overflow)"
        if metrics["nan_skipped_steps"]:
            steps += f" ({metrics['nan_skipped_steps']} skipped: non-finite)"
        if resumed_step is not None:
            steps += f" (resumed at {resumed_step:,})"
        tokens = (  # images and audio have no tokens
            [
                ("tokens/s (train, no padding)", f"{metrics['train_tokens_per_second']:.0f}"),
                ("padding", f"{metrics['padding_fraction']:.1%}"),
            ]
            if metrics["padding_fraction"] is not None
            else []
        )
        peak = self.flop_peak.flops_per_second / 1e12
        rows = [
            *eval_rows,
            ("train loss (last log)", f"{metrics['train_loss']:.4f}" if metrics["train_loss"] is not None else "-"),
            ("optimizer steps", steps),
            ("samples/s (train)", f"{metrics['train_samples_per_second'] or 0:.1f}"),
            *tokens,
            (
                "MFU (steady)",
                f"{metrics['steady_mfu']:.1%} of {peak:.3g} TFLOP/s" if metrics["steady_mfu"] is not None else "-",
            ),
            *_generation_rows(metrics),
            ("peak memory over baseline", f"{over * mb:.0f} MB" if over is not None else "-"),
            ("optimizer state", f"{metrics['optimizer_state_bytes'] * mb:.1f} MB"),
            ("wall time", f"{metrics['wall_seconds']:.1f} s"),
            *source_rows(metrics.get("sources") or {}),
        ]
        return summary_table("summary", rows).rstrip()


def source_rows(sources: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """The end-of-run table's row per source: the share asked beside the shares drawn, and its evaluation."""
    rows = []
    for name, row in sources.items():
        asked = f"asked {row['weight']:.1%}" if row.get("weight") is not None else "asked -"
        drawn = f"drew {row['share_examples']:.1%} of examples, {row['share_tokens']:.1%} of tokens"
        loss = row.get("eval_loss")
        rows.append((f"source {name}", f"{asked}, {drawn}" + (f"; eval loss {loss:.4f}" if loss is not None else "")))
    return rows


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _generation_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """A run that generated its examples while training: generation's and training's shares of the loop's time."""
    generate, train = metrics.get("time_generate_seconds") or 0.0, metrics.get("time_forward_backward_seconds") or 0.0
    wall = metrics.get("time_wall_seconds") or 0.0
    if not generate or not wall:
        return []
    return [("generate / train time", f"{generate:.1f} s ({generate / wall:.0%}) / {train:.1f} s ({train / wall:.0%})")]
