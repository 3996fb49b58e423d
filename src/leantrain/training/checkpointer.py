"""The checkpoint policy: which checkpoint to resume, when to save, and what a save holds.

What a checkpoint is on disk (atomic saves, verification, the manifest) is `leantrain.run.checkpoint`'s; this
component decides when, and hands it the one `TrainState` plus the objects whose state is saved.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from leantrain.errors import ConfigError
from leantrain.run import checkpoint
from leantrain.run.checkpoint import Checkpoint, TrainState


class Checkpointer:
    def __init__(self, cfg, run, accelerator, say):
        self.cfg, self.run, self.accelerator, self.say = cfg, run, accelerator, say
        self.dir = checkpoint.CheckpointDir(run.path / "checkpoints", accelerator)
        self.every: int | None = None  # in steps, once `schedule` knows an epoch's length
        self.last_step: int | None = None
        self.keep_best = bool(cfg.load_best_at_end)  # each new best is saved, to be published at the end
        self.processor: Any = None
        self.trained: dict[str, Any] = {}  # model, optimizer, scheduler, amp, local_sgd: set by `attach`
        self.facts: dict[str, Any] = {}  # what a resumed run must match
        self.log_path: Path | None = None

    # -- resuming -------------------------------------------------------------------------------------------
    def find_resume(self) -> Checkpoint | None:
        """The checkpoint to resume, or None. A fresh run refuses a directory holding an unfinished run's
        checkpoints (--overwrite discards them); --resume auto with none found starts from scratch."""
        cfg, main = self.cfg, self.accelerator.is_main_process
        if main:
            self.dir.clean()  # saves and prunes cut short by a kill
        found = None
        if cfg.resume is None:
            newest = self.dir.step_dirs()
            if newest and not cfg.overwrite:
                raise ConfigError(
                    f"--output-dir: '{self.run.path}' holds checkpoints of an unfinished run (newest: "
                    f"{newest[0].name}); pass --resume auto to continue it, or --overwrite to start over"
                )
            if newest and main:
                self.say.info(f"--overwrite: discarding the checkpoints in {self.dir.root}")
                self.dir.discard_all()
        else:
            found = self.dir.find(cfg.resume, self.run.path, warn=self.say.info)
            if found is None:
                self.say.info(f"--resume auto: no checkpoint in {self.dir.root} yet; starting from scratch")
        self.accelerator.wait_for_everyone()
        return found

    def attach(self, facts: dict[str, Any], log_path: Path | None, processor: Any = None, **trained: Any) -> None:
        """What every save holds besides the train state: the trained objects, the run's facts, and the processor
        (saved beside the model so that a checkpoint folder loads as a model)."""
        self.facts, self.log_path, self.trained, self.processor = facts, log_path, trained, processor

    def restore(self, ckpt: Checkpoint, state: TrainState) -> dict:
        """Load `ckpt` into the trained objects and `state`; returns the RNG state to set just before the loop."""
        rng = checkpoint.restore(ckpt, **self.trained, accelerator=self.accelerator)
        best = state.best_metric
        for f in dataclasses.fields(TrainState):
            setattr(state, f.name, getattr(ckpt.progress, f.name))
        if not self.accelerator.is_main_process:  # the checkpoint holds the whole job's sums of the row in progress
            state.logged_loss, state.logged_units = 0.0, 0.0
            state.source_window = [0.0] * len(state.source_window)
        if state.best_metric != best:  # another yardstick: its best is yet to be seen
            state.best_metric, state.best_value, state.best_step = best, None, None
            state.stopping_reference, state.evals_without_improvement = None, 0  # early stopping's too
        return rng

    def schedule(self, steps_per_epoch: int, last_step: int | None = None) -> None:
        """--save-every in optimizer steps (`epoch`: one pass over the data); `last_step`: the run's last, which a
        run that keeps checkpoints saves too (the HF Trainer's rule): a run trained further goes on from its end."""
        from leantrain.training.early_stopping import steps_every

        self.every = steps_every(self.cfg.save_every, steps_per_epoch)
        self.last_step = last_step

    def warn_if_short_of_space(self, model, model_bytes: int) -> None:
        """Before training: refuse a disk that cannot hold the final model (`model_bytes`: its weights and processor)
        or one checkpoint; warn when the checkpoints to keep and the model may not fit together."""
        saves = self.every or self.keep_best
        ckpt = checkpoint.estimate_checkpoint_bytes(model, self.cfg.optimizer, self.cfg) if saves else 0
        note = checkpoint.free_space_check(self.run.path, ckpt, self.cfg.save_total_limit, model_bytes)
        if note:
            self.say.info(f"warning: {note}")

    def rescue(self, state: TrainState, rng: dict, roots: list[Path]) -> Path | None:
        """The trained state as a checkpoint under the first of `roots` that takes it (the final save failed for want
        of space or access): a single process's run, not sharded. Returns where, or None."""
        from leantrain.run.directory import WriteFailed

        model = self.accelerator.unwrap_model(self.trained["model"])
        for root in roots:
            try:
                saved = checkpoint.CheckpointDir(root).save(
                    state,
                    **{**self.trained, "model": model},
                    rng=rng,
                    config=self.cfg.to_dict(),
                    facts=self.facts,
                    log_path=self.log_path,
                    reason="rescued: the final save failed",
                    processor=self.processor,
                )
            except (OSError, WriteFailed, checkpoint.CheckpointError):
                continue
            return saved
        return None

    # -- saving ---------------------------------------------------------------------------------------------
    def should_save(self, step: int, new_best: bool) -> bool:
        kept = bool(self.every or self.keep_best)
        return bool(self.every and step % self.every == 0) or (kept and (new_best or step == self.last_step))

    def maybe_save(self, state: TrainState, new_best: bool) -> Path | None:
        if not self.should_save(state.step, new_best):
            return None
        periodic = bool(self.every and state.step % self.every == 0)
        reason = f"best eval {state.best_metric}" if new_best else "the last step"
        reason = f"every {self.every} steps" if periodic else reason
        return self.save(state, reason, checkpoint.rng_state())

    #: called with the state before every save, on every process (the metrics logger gathers the log row's sums)
    before_save: Any = None

    def save(self, state: TrainState, reason: str, rng: dict, **rollback: Any) -> Path:
        """Checkpoint the run as it stands (or as it stood, with `rollback` counters); every process calls it.
        The weights saved are those evaluated (schedule-free's average), with the optimizer state that goes with
        them; the run trains on from its training weights."""
        from leantrain.model.optimizers import evaluation_weights

        if self.before_save is not None:
            self.before_save(state)
        with evaluation_weights(self.cfg.optimizer, self.trained["optimizer"]):
            return self.dir.save(
                dataclasses.replace(state, **rollback),
                **self.trained,
                rng=rng,
                config=self.cfg.to_dict(),
                facts=self.facts,
                log_path=self.log_path,
                reason=reason,
                keep=self.cfg.save_total_limit,
                processor=self.processor,
            )

    def saved(self, step: int) -> Path:
        return self.dir.root / f"{checkpoint.PREFIX}{step:06d}"

    def best_kept(self) -> bool:
        """Whether the best evaluation is checkpointed (checkpoints are on): `saved(best_step)` then holds it."""
        return bool(self.every or self.keep_best)

    def load_best_weights(self, state: TrainState) -> Path:
        """--load-best-at-end: put the best evaluation's checkpointed weights into the model (every process)."""
        from leantrain.run.checkpoint import CheckpointError

        path = self.saved(state.best_step or 0)
        if not (path / "model.safetensors").is_file():
            raise CheckpointError(f"--load-best-at-end: the best step's checkpoint {path} is missing")
        ckpt = checkpoint.verify(path)
        checkpoint.load_weights(ckpt, self.trained["model"], self.accelerator)
        return path
