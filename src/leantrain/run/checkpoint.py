"""Checkpoints that never lose work: atomic saves, exact resume, and a refusal to resume a different run.

Layout of `OUTPUT_DIR/checkpoints/step-000123/` (one per save; the directory name is its optimizer step):

    model.safetensors    the model's weights (safetensors: loading runs no code)
    optimizer.pt         optimizer.state_dict() (AdamW moments, bitsandbytes 8-bit blocks, Adafactor factors)
    training_state.pt    scheduler, loss scaler, local SGD counters and outer momentum
    rank-0.pt ...        per process: every RNG (Python, NumPy, torch, CUDA); with local SGD its optimizer too;
                         the task's own state between steps (`Task.training_state`: generations reused later)
    metrics.jsonl        the run's log so far, which a resumed run continues
    config.json ...      the model's config and its processor (tokenizer): with model.safetensors, the
                         save_pretrained layout, so `predict`, `evaluate` and `pipeline` load the folder
    checkpoint.json      written last: step counters, data position, best metric, resolved config, and the
                         size and CRC-32 of every file above

Atomic: a save writes into `.step-000123.tmp-RUN/` beside its final place (RUN: the main process's pid, so
two runs never share one), fsyncs every file and the directory, then renames it into place, so a directory
named `step-*` is complete or absent. A kill mid-save leaves a `.tmp-*` directory that nothing reads (and the
next run deletes) and the previous checkpoint untouched. Pruning renames a checkpoint away before deleting it,
for the same reason; saving a step again renames the old copy to `.step-000123.old-RUN` first, which the next
run puts back if the kill came between the two renames. A full disk is one line naming the path and the space
needed, the partial save removed; weights that hold NaN or infinity are never saved.

Safe loading: weights through safetensors, everything else through `torch.load(weights_only=True)` or
JSON, after every file's size and checksum were verified: a corrupted or truncated file is named in a
one-line `LeantrainError` instead of failing deep inside torch.

Exact resume: the data order is a function of (seed, epoch), so the position is (epoch, optimizer steps
done in it) and the sampler seeks there; the loaders draw no numbers from the global RNGs, so restoring
them just before the loop puts every dropout mask where it was.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leantrain.errors import ConfigError, LeantrainError
from leantrain.run.directory import NonFiniteModel, fsync_dir, nonfinite_count, write_failure

FORMAT = 1
MANIFEST = "checkpoint.json"
PREFIX = "step-"

#: config keys that may change between a run and its resumption: they change how long the run goes on,
#: where and how often it reports and saves, not what any optimizer step computes
RESUMABLE_CHANGES = frozenset(
    {
        "epochs",
        "max_steps",
        "max_time",
        "save_every",
        "save_total_limit",
        "eval_every",
        "log_every",
        "output_dir",
        "progress",
        "overwrite",
        "resume",
        "cache_dir",
        "on_nan",
        "metric_for_best",
        "trust_remote_code",
        "main_process_ip",
        "main_process_port",
        "launcher",  # the number of processes itself is checked as a fact
        "collective_timeout",  # how long processes wait for each other, not what they compute
        "log",
        "report",
        "save_on_interrupt",
        "save_adapter",  # LoRA: what is written at the end, not what a step computes
        # --- HF Trainer users: how long the run goes on, what it publishes, how it evaluates
        "load_best_at_end",
        "early_stopping_patience",
        "early_stopping_threshold",
        "eval_batch_size",
        "dataloader_num_workers",
        "thread_governor",  # the thread count: how a step is computed, to rounding, not what it computes
        "flat_parameters",  # where the numbers live (the gradients' norm sums in another order); the same state
    }
)
#: config keys whose resolved value is compared as a fact instead (`auto` precision that resolved to bf16 is bf16; a
#: task left to inference is the task it inferred, so the run's own config.yaml, which records it, resumes; a token
#: classifier's stride left out is the one its --max-length gives, and a task that reads none compares none)
COMPARED_AS_FACTS = frozenset({"precision", "num_processes", "task", "stride"})
#: facts a checkpoint of an older leantrain has only as its config's setting: compared with that
FACTS_RECORDED_AS_SETTINGS = frozenset({"stride"})
#: config keys naming files: the same file by another spelling (relative, absolute, ~) is the same setting
PATH_KEYS = ("model", "data", "eval_data")
#: what every checkpoint holds besides the manifest (plus rank-N.pt per process; optimizer.pt unless per rank)
REQUIRED_FILES = ("model.safetensors", "training_state.pt")


class CheckpointError(LeantrainError):
    """A checkpoint is missing, incomplete, corrupted, or belongs to a different run."""


# -- what a checkpoint records besides tensors ---------------------------------------------------------------


@dataclass
class TrainState:
    """Where the run is: counters, data position and running sums. The trainer mutates this one object in
    place (no copies of its counters elsewhere); a checkpoint saves it whole, in checkpoint.json."""

    step: int = 0  # optimizer steps done (NaN-skipped ones included)
    micro_step: int = 0
    epoch: int = 0
    steps_in_epoch: int = 0  # optimizer steps (= global batches) done in `epoch`
    logged_loss: float = 0.0  # loss summed since the last metrics.jsonl row
    logged_units: float = 0.0  # the loss units (examples or tokens) behind logged_loss
    logged_sums: dict[str, float] = field(default_factory=dict)  # the task's `train_sums` since the last row
    nan_skipped_steps: int = 0
    elapsed_seconds: float = 0.0
    time_budget: dict[str, Any] = field(default_factory=dict)  # --max-time's sizes and readings (TimeBudget.state)
    best_metric: str = "accuracy"
    best_value: float | None = None
    best_step: int | None = None
    # early stopping: the value the last counted improvement reached, and evaluations since it
    stopping_reference: float | None = None
    evals_without_improvement: int = 0
    # a mixture (training/sources.py): each source's [loss, units, examples, tokens] since the last log row, flat;
    # and the examples and tokens drawn from each since the run began
    source_window: list[float] = field(default_factory=list)
    source_examples: list[float] = field(default_factory=list)
    source_tokens: list[float] = field(default_factory=list)

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> TrainState:
        saved = dict(saved)
        if "logged_examples" in saved:  # checkpoints before the loss counted units other than examples
            saved["logged_units"] = float(saved.pop("logged_examples"))
        return cls(**saved)

    def update_best(self, metrics: dict[str, float], step: int) -> bool:
        """Record an evaluation; True when it is the best so far (loss: lower is better, else higher)."""
        from leantrain.tasks.scoring import lower_is_better

        key = metric_key(self.best_metric, tuple(metrics))
        value, lower = metrics[key], lower_is_better(key)
        if self.best_value is None or (value < self.best_value if lower else value > self.best_value):
            self.best_value, self.best_step = value, step
            return True
        return False


def metric_key(name: str, reported: tuple[str, ...] | None = None) -> str:
    """`eval_accuracy` and `accuracy` both name the evaluation's accuracy; refused when not among `reported`
    (the task checks the name against its metrics before the run: `Task.metric_for_best`)."""
    key = name.removeprefix("eval_")
    if reported is not None and key not in reported:
        raise ConfigError(
            f"--metric-for-best {name!r} is not an evaluation metric; choose one of {', '.join(reported)}"
        )
    return key


#: settings a checkpoint of an older leantrain does not record, as those runs had them (nothing frozen, the model's
#: own dropout)
SETTINGS_BEFORE_RECORDED = {"freeze": "none", "dropout": None}


@dataclass
class Checkpoint:
    """A verified, complete checkpoint on disk (its manifest read, its files' sizes and checksums checked)."""

    path: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def step(self) -> int:
        return self.manifest["progress"]["step"]

    @property
    def progress(self) -> TrainState:
        return TrainState.from_saved(self.manifest["progress"])

    def check_matches(self, config: dict[str, Any], facts: dict[str, Any]) -> None:
        """Refuse to resume when a setting that changes the result differs; name every differing key."""
        # settings newer than the checkpoint are compared as the run that wrote it had them
        saved = {**SETTINGS_BEFORE_RECORDED, **self.manifest["config"]}
        config = json.loads(json.dumps(config))
        for key in PATH_KEYS:  # compare files, not spellings (the manifest records what they resolved to then)
            if key in config and key in saved:
                config[key] = normalise_path(config[key])
                # again: a mixture's sources were recorded as given before they were resolved too
                saved[key] = normalise_path(self.manifest.get("resolved_paths", {}).get(key, saved[key]))
        saved_facts = self.manifest.get("facts", {})
        # a checkpoint from before the task was a fact has only the task as asked: compare that
        as_facts = COMPARED_AS_FACTS if "task" in saved_facts else COMPARED_AS_FACTS - {"task"}
        compared = [k for k in config if k not in RESUMABLE_CHANGES and k not in as_facts and k in saved]
        differing = [k for k in compared if _as_shares(saved[k]) != _as_shares(config[k])]
        changed = [(k, saved[k], config[k]) for k in differing]
        saved_facts = {**{k: saved[k] for k in FACTS_RECORDED_AS_SETTINGS if k in saved}, **saved_facts}
        changed += [(k, saved_facts[k], facts[k]) for k in facts if saved_facts.get(k, facts[k]) != facts[k]]
        if changed:  # facts are resolved values: `auto` precision shows as what it resolved to
            raise CheckpointError(
                f"cannot resume from {self.path}: {_differences(changed)}, which would change the result. Use the "
                f"checkpoint's settings (its config is in {self.path / MANIFEST}), or start a new run in another "
                "--output-dir"
            )


def _differences(changed: list[tuple[str, Any, Any]]) -> str:
    """`lr differs (5e-05 in the checkpoint, 0.001 now) and seed differs (42 in the checkpoint, 3 now)`."""
    each = [f"{k} differs ({_show(before)} in the checkpoint, {_show(now)} now)" for k, before, now in changed]
    return each[0] if len(each) == 1 else f"{', '.join(each[:-1])} and {each[-1]}"


def _as_shares(value: Any) -> Any:
    """A mixture's sources with each weight as its share of their sum: @7/@3 and @0.7/@0.3 draw the same steps."""
    if not isinstance(value, list) or not all(isinstance(v, dict) and v.get("weight") for v in value):
        return value
    total = sum(v["weight"] for v in value)
    # to 12 digits: 0.7 / (0.7 + 0.3) and 7 / 10 may differ in the last bits, which no step's draw can tell
    return [{**v, "weight": float(f"{v['weight'] / total:.12g}")} for v in value]


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def normalise_path(value: Any) -> Any:
    """An existing file or folder as its absolute resolved path, a mixture's sources each with theirs (their own
    eval_data too); anything else (a hub name, None) unchanged."""
    if isinstance(value, list):
        return [normalise_path(v) for v in value]
    if isinstance(value, dict):
        return {k: normalise_path(v) if k in ("path", "eval_data") else v for k, v in value.items()}
    if not isinstance(value, str):
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


# -- RNG ------------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every global RNG this process uses, in a form torch.load(weights_only=True) reads back."""
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # the global RNG is an MT19937: its legacy state is a tuple
    kind, key, pos, has_gauss, gauss = legacy
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- the checkpoints folder -----------------------------------------------------------------------------------


class CheckpointDir:
    """`OUTPUT_DIR/checkpoints`: save, find, verify, load and prune checkpoints.

    Every process calls `save` (each writes its own RNG); the main process writes the rest and renames.
    """

    def __init__(self, root: str | Path, accelerator=None):
        self.root = Path(root)
        self.accelerator = accelerator
        self.run_id: str | None = None  # the main process's pid, agreed by every process at the first save

    # -- finding ----------------------------------------------------------------------------------------------
    def step_dirs(self) -> list[Path]:
        """Checkpoint directories by step, newest first (complete or not: renames make them complete)."""
        if not self.root.is_dir():
            return []
        dirs = [
            p
            for p in self.root.iterdir()
            if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
        ]
        return sorted(dirs, key=lambda p: int(p.name[len(PREFIX) :]), reverse=True)

    def latest(self, warn=None) -> Checkpoint | None:
        """The newest checkpoint that verifies; a damaged newer one is reported through `warn` and passed over."""
        for path in self.step_dirs():
            try:
                return verify(path)
            except CheckpointError as exc:
                if warn is not None:
                    warn(f"{exc}; trying an older checkpoint")
        return None

    def clean(self) -> None:
        """Repair what killed saves and prunes left (main process, holding the output directory's lock, so every
        such folder is a dead run's): a re-saved step's old copy whose new copy never arrived goes back in place;
        partial saves (`.step-*.tmp*`) and prunes (`.step-*.deleting*`) are deleted."""
        if not self.root.is_dir():
            return
        from leantrain.paths import left_by_dead_run

        for p in sorted(self.root.iterdir()):
            if not p.name.startswith(f".{PREFIX}") or not left_by_dead_run(p.name):
                continue  # not a leftover, or a live run's (where the file system could not lock)
            name, _, kind = p.name[1:].partition(".")
            if kind.startswith("old") and not (self.root / name).exists():
                os.replace(p, self.root / name)  # killed between the two renames of a re-save
            elif kind.startswith(("tmp", "deleting", "old")) or p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)

    def discard_all(self) -> None:
        """Set every checkpoint aside (a fresh run with --overwrite): the run directory deletes them when the new
        run publishes and puts them back if it stops first (`RunDir`). Main process."""
        from leantrain.run.directory import REPLACED_PREFIX

        if self.root.is_dir():
            aside = self.root.parent / f"{REPLACED_PREFIX}{os.getpid()}"
            aside.mkdir(exist_ok=True)
            if (aside / self.root.name).exists():
                shutil.rmtree(aside / self.root.name)
            os.replace(self.root, aside / self.root.name)

    # -- saving -----------------------------------------------------------------------------------------------
    def save(
        self,
        progress: TrainState,
        *,
        model,
        optimizer,
        scheduler,
        amp,
        local_sgd,
        rng: dict,
        config: dict,
        facts: dict,
        log_path: Path | None,
        reason: str,
        keep: int | None = None,
        processor=None,
        task=None,
    ) -> Path:
        """Write checkpoint `step-{progress.step}` atomically, then prune to the newest `keep` (+ the best).

        Collective: every process calls it at the same step. An OSError (disk full, unwritable) becomes a
        CheckpointError naming the path, after the partial save is removed; earlier checkpoints stay intact.
        """
        acc = self.accelerator
        main = acc is None or acc.is_main_process
        rank = 0 if acc is None else acc.process_index
        name = f"{PREFIX}{progress.step:06d}"
        tmp = self.root / f".{name}.tmp-{self._run_id()}"
        per_rank_optimizer = getattr(local_sgd, "enabled", False)  # local SGD: each process has its own moments
        if local_sgd is not None:
            local_sgd.sync()  # the processes' parameters agree before they are saved (collective)
        unwrapped_model = acc.unwrap_model(model) if acc is not None else model
        self._refuse_nonfinite(name, unwrapped_model)
        self._need_bytes = _state_bytes(unwrapped_model, optimizer)
        whole = _gathered(unwrapped_model, optimizer)  # --shard fsdp: whole on the main process (collective)

        def write_own():
            own = {"rng": rng, "optimizer": optimizer.state_dict() if per_rank_optimizer else None}
            if task is not None and (task_state := task.training_state()) is not None:
                own["task"] = task_state
            _write(tmp / f"rank-{rank}.pt", lambda f: torch.save(own, f))
            if main:
                trained = dict(model=unwrapped_model, scheduler=scheduler, amp=amp, local_sgd=local_sgd)
                self._write_shared(tmp, optimizer=None if per_rank_optimizer else optimizer, whole=whole, **trained)
                _write_loadable(tmp, unwrapped_model, processor)
                if log_path is not None and log_path.is_file():
                    _write(tmp / "metrics.jsonl", lambda f: f.write(log_path.read_bytes()))

        manifest = self._manifest(progress, reason, facts, config, per_rank_optimizer)
        prepare, publish = (lambda: self._prepare(tmp)), (lambda: self._publish(tmp, name, manifest))
        for phase in (prepare, write_own, publish) if main else (_nothing, write_own, _nothing):
            self._collectively(phase, tmp)  # each phase on every process at once, so that a failure stops all
        if main:
            self.prune(keep, progress.best_step)
        return self.root / name

    def _manifest(self, progress: TrainState, reason: str, facts: dict, config: dict, per_rank_optimizer) -> dict:
        """What the checkpoint's manifest says of the run; `_publish` adds what the folder holds (`_contents`)."""
        return {
            "format": FORMAT,
            "reason": reason,
            "progress": asdict(progress),
            "facts": facts,
            "config": config,
            "num_processes": 1 if self.accelerator is None else self.accelerator.num_processes,
            "per_rank_optimizer": per_rank_optimizer,
        }

    def _prepare(self, tmp: Path) -> None:
        """An empty folder for the save to fill (main process)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()

    def _publish(self, tmp: Path, name: str, manifest: dict) -> None:
        """The manifest last, then the folder in place under `name` in one rename (main process): a kill at any
        point leaves the previous checkpoint or this one, never half of one."""
        final, old = self.root / name, self.root / f".{name}.old-{self.run_id}"
        manifest = {**manifest, **_contents(tmp, manifest["config"])}
        _write(tmp / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. by a run that was resumed before it)
            os.replace(final, old)  # a kill right after this: clean() puts it back
        os.replace(tmp, final)
        fsync_dir(self.root)
        shutil.rmtree(old, ignore_errors=True)

    def _write_shared(self, tmp: Path, *, model, optimizer, scheduler, amp, local_sgd, whole=None) -> None:
        """What all processes share, written once (main process): weights, optimizer (unless per process),
        scheduler, loss scaler and local SGD state. `whole`: a sharded run's (weights, optimizer state), gathered."""
        from safetensors.torch import save_file, save_model

        from leantrain.model.flat import WholeTensors

        # format=pt: what from_pretrained expects of a safetensors file, so the folder loads as a model
        meta = {"format": "pt"}
        if whole is not None:
            _write_to_path(tmp / "model.safetensors", lambda p: save_file(whole[0], str(p), metadata=meta))
        else:
            _write_to_path(tmp / "model.safetensors", lambda p: save_model(WholeTensors(model), str(p), metadata=meta))
        if optimizer is not None:
            optimizer_state = whole[1] if whole is not None else optimizer.state_dict()
            _write(tmp / "optimizer.pt", lambda f: torch.save(optimizer_state, f))
        scaler = getattr(self.accelerator, "scaler", None) if self.accelerator is not None else None
        state = {
            "scheduler": scheduler.state_dict(),
            "amp": amp.state_dict() if amp is not None else None,
            "accelerate_scaler": scaler.state_dict() if scaler is not None else None,
            "local_sgd": local_sgd.state_dict() if local_sgd is not None else None,
        }
        _write(tmp / "training_state.pt", lambda f: torch.save(state, f))

    def _run_id(self) -> str:
        """This run's name for its temporary folders (rank 0's pid, on every process): another run's never clash."""
        if self.run_id is None:
            self.run_id = str(os.getpid())
            acc = self.accelerator
            if acc is not None and acc.num_processes > 1:
                from leantrain.parallel import broadcast_from_main

                self.run_id = broadcast_from_main(self.run_id)
        return self.run_id

    def _refuse_nonfinite(self, name: str, model) -> None:
        """Diverged weights are never saved as a "last good" state (one check per save, not per step)."""
        bad, total = nonfinite_count(p.detach() for p in model.parameters())
        if not _all_agree(self.accelerator, bad == 0):
            previous = next((p.name for p in self.step_dirs()), None)
            where = f"{bad:,} of {total:,} weights are NaN or infinite" if bad else "another process's weights diverged"
            raise NonFiniteModel(
                f"not saving checkpoint {name}: {where} (the weights diverged before the loss did; lower --lr)"
                + (f"; the newest checkpoint, {previous}, was saved before" if previous else "")
            )

    def _collectively(self, phase, tmp: Path) -> None:
        """Run one phase of a save on every process; if it fails anywhere, clean up and fail everywhere.

        A full disk shows as an OSError, a RuntimeError from torch.save or a SafetensorError: each becomes one
        line naming the path and the space a checkpoint needs; any other failure stays a bug (traceback)."""
        error, failure = None, None
        try:
            phase()
        except Exception as exc:
            failure = write_failure(exc, tmp, getattr(self, "_need_bytes", None))
            if failure is None:
                if self.accelerator is None or self.accelerator.is_main_process:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
            error = exc
        if not _all_agree(self.accelerator, error is None):
            if self.accelerator is None or self.accelerator.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            if error is not None:  # measured again now that the partial save is gone
                failure = write_failure(error, tmp, getattr(self, "_need_bytes", None))
            what = str(failure) if failure is not None else f"cannot write {tmp} (another process failed to save)"
            previous = next((p.name for p in self.step_dirs()), None)
            kept = f"; the previous checkpoint {previous} is intact" if previous else ""
            raise CheckpointError(f"checkpoint not saved: {what}{kept}") from None

    def prune(self, keep: int | None, best_step: int | None = None) -> None:
        """Keep the newest `keep` checkpoints and `best_step`'s (at most keep + 1); rename the others away, then
        delete them. `best_step` is the saving run's record: a newer manifest on disk may be an abandoned run's
        (this one resumed an older checkpoint)."""
        if not keep:
            return
        best = self.root / f"{PREFIX}{best_step:06d}" if best_step is not None else None
        for path in self.step_dirs()[keep:]:
            if path != best:
                aside = path.with_name(f".{path.name}.deleting")
                os.replace(path, aside)
                shutil.rmtree(aside, ignore_errors=True)

    # -- loading ----------------------------------------------------------------------------------------------
    def find(self, resume: str | None, output_dir: Path, warn=None) -> Checkpoint | None:
        """The checkpoint `--resume` names: 'auto' (newest complete one here; None if there is none) or a path."""
        if resume is None:
            return None
        if resume == "auto":
            return self.latest(warn)
        path = Path(resume).expanduser()
        give = f"give a {self.root.name}/{PREFIX}NNNNNN folder, a run directory, or 'auto'"
        if (path / self.root.name).is_dir() and not (path / MANIFEST).exists():
            found = CheckpointDir(path / self.root.name).latest(warn)  # a run directory: its newest checkpoint
            if found is None:
                raise CheckpointError(f"--resume {resume}: no complete checkpoint in {path / self.root.name}")
            return found
        if not path.exists():
            raise CheckpointError(f"--resume {resume}: no such checkpoint folder; {give}")
        if not path.is_dir():
            raise CheckpointError(f"--resume {resume}: a file, not a checkpoint folder; {give}")
        steps = CheckpointDir(path).step_dirs()
        if steps and not (path / MANIFEST).exists():  # RUN/checkpoints itself: say which folder to give
            raise CheckpointError(
                f"--resume {resume}: this is a folder of checkpoints, not one checkpoint; give one of its "
                f"{PREFIX}NNNNNN folders (newest: {steps[0]}), its run directory {path.parent}, or 'auto'"
            )
        if not (path / MANIFEST).exists() and (path / "config.json").is_file() and not any(path.glob("*.pt")):
            raise CheckpointError(
                f"--resume {resume}: a model folder (a run's published model/), not a checkpoint: it holds no "
                f"optimizer or schedule to go on with; {give}, or start from its weights with --model {resume}"
            )
        if not (path / MANIFEST).exists() and not any(path.glob("*.pt")) and not (path / "model.safetensors").exists():
            raise CheckpointError(f"--resume {resume}: not a leantrain checkpoint (no {MANIFEST}); {give}")
        return verify(path)


def verify(path: Path) -> Checkpoint:
    """Read the manifest and check that every file it lists is there with its size and checksum."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {MANIFEST}: its save never finished)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files, progress = manifest["files"], manifest["progress"]
        TrainState.from_saved(progress)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable or damaged ({type(exc).__name__}: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{manifest_path}: checkpoint format {manifest.get('format')} is not the "
            f"format {FORMAT} this leantrain reads"
        )
    per_rank = manifest.get("per_rank_optimizer", False)
    required = [*REQUIRED_FILES, *(() if per_rank else ("optimizer.pt",))]
    required += [f"rank-{r}.pt" for r in range(int(manifest.get("num_processes", 1)))]
    unlisted = [n for n in required if n not in files]
    if unlisted:  # restore() loads these names: a manifest that leaves one out does not vouch for it
        raise CheckpointError(
            f"{manifest_path}: does not list {', '.join(unlisted)}, which every checkpoint holds; the checkpoint is "
            "damaged or was not written by leantrain; resume from another checkpoint with --resume PATH"
        )
    for name, want in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing from the checkpoint")
        size = file.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(
                f"{file}: truncated or damaged ({size:,} bytes, the checkpoint recorded "
                f"{want['bytes']:,}); resume from another checkpoint with --resume PATH"
            )
        if _crc32(file) != want["crc32"]:
            raise CheckpointError(
                f"{file}: corrupted (its checksum differs from the one recorded at save); "
                "resume from another checkpoint with --resume PATH"
            )
    return Checkpoint(path, manifest)


def restore(ckpt: Checkpoint, *, model, optimizer, scheduler, amp, local_sgd, accelerator, task=None) -> dict:
    """Load weights, optimizer, scheduler, scaler, local SGD and the task's state; returns this process's RNG state,
    to be set (with `set_rng_state`) just before the loop resumes. The caller checked the config matches."""
    from leantrain.parallel import sharding

    rank = accelerator.process_index
    own = _load(ckpt.path / f"rank-{rank}.pt", _torch_load)
    if task is not None:
        task.load_training_state(own.get("task"))
    unwrapped = accelerator.unwrap_model(model)
    if sharding.is_sharded(unwrapped):  # --shard fsdp: whole state on disk, each process takes its shards
        from safetensors.torch import load_file

        weights = _load(ckpt.path / "model.safetensors", load_file)
        optimizer_state = _load(ckpt.path / "optimizer.pt", _torch_load)
        _load(
            ckpt.path / "optimizer.pt",
            lambda p: sharding.load_full_state(unwrapped, optimizer, weights, optimizer_state),
        )
    else:
        load_weights(ckpt, model, accelerator)
        if ckpt.manifest.get("per_rank_optimizer"):
            optimizer_file, optimizer_state = ckpt.path / f"rank-{rank}.pt", own["optimizer"]
        else:
            optimizer_file = ckpt.path / "optimizer.pt"
            optimizer_state = _load(optimizer_file, _torch_load)
        _load(optimizer_file, lambda p: optimizer.load_state_dict(optimizer_state))
    state = _load(ckpt.path / "training_state.pt", _torch_load)
    _load(
        ckpt.path / "training_state.pt",
        lambda p: _restore_training_state(state, scheduler, amp, local_sgd, accelerator),
    )
    return own["rng"]


def load_weights(ckpt: Checkpoint, model, accelerator) -> None:
    """The checkpoint's weights into the (unwrapped) model, strictly: every tensor, nothing else."""
    from safetensors.torch import load_model

    from leantrain.parallel import sharding

    unwrapped = accelerator.unwrap_model(model)
    if sharding.is_sharded(unwrapped):
        from safetensors.torch import load_file

        weights = _load(ckpt.path / "model.safetensors", load_file)
        _load(ckpt.path / "model.safetensors", lambda p: sharding.load_full_state(unwrapped, None, weights, None))
        return
    from leantrain.model.flat import WholeTensors

    _load(ckpt.path / "model.safetensors", lambda p: load_model(WholeTensors(unwrapped), p, strict=True))


def _restore_training_state(state, scheduler, amp, local_sgd, accelerator) -> None:
    scheduler.load_state_dict(state["scheduler"])
    if amp is not None and state["amp"] is not None:
        amp.load_state_dict(state["amp"])
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None and state.get("accelerate_scaler"):
        scaler.load_state_dict(state["accelerate_scaler"])
    if local_sgd is not None and state["local_sgd"] is not None:
        local_sgd.load_state_dict(state["local_sgd"])


def restore_log(ckpt: Checkpoint, log_path: Path) -> list[dict]:
    """Put the checkpoint's metrics.jsonl in place for the resumed run to append to; returns its rows."""
    source = ckpt.path / "metrics.jsonl"
    if not source.is_file():
        return []
    shutil.copyfile(source, log_path)
    return [json.loads(line) for line in source.read_text().splitlines() if line.strip()]


def free_space_check(path: Path, checkpoint_bytes: int, keep: int | None, model_bytes: int = 0) -> str | None:
    """Fail now if the checkpoints folder cannot be written, or the disk cannot hold the final model
    (`model_bytes`) or one checkpoint (`checkpoint_bytes`, 0 without checkpoints); return a warning if `keep` of
    them and the model may not fit together."""
    root = path / "checkpoints"
    if checkpoint_bytes and root.exists():
        probe = root / f".{PREFIX}write-test-{os.getpid()}.tmp"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(
                f"cannot write checkpoints to {root} ({exc.strerror}); make it writable or choose another --output-dir"
            ) from None
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    mb = 1 / 2**20
    for what, need in (("one checkpoint", checkpoint_bytes), ("the final model", model_bytes)):
        if free < need * 1.1:
            raise CheckpointError(
                f"--output-dir {path}: {free * mb:,.1f} MB free, but {what} needs about {need * mb:,.1f} MB; free "
                "some space or choose another --output-dir"
            )
    if not checkpoint_bytes:
        return None
    need = checkpoint_bytes * ((keep + 2) if keep else 2) + model_bytes
    if free < need:
        return (
            f"{free * mb:,.0f} MB free in {path}: the checkpoints and the final model may need about "
            f"{need * mb:,.0f} MB (set --save-total-limit to keep fewer)"
        )
    return None


def estimate_checkpoint_bytes(model, optimizer_name: str, settings: Any = None) -> int:
    """Weights plus optimizer state, before the optimizer has made its (lazy) state: the state counted as the
    planner counts it (one count of optimizer-state bytes in the package; `settings`: the run's, e.g. a projection
    rank), plus 1 MiB of the rest."""
    from leantrain.model.optimizers import model_state_bytes

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + model_state_bytes(model, optimizer_name, settings) + (1 << 20)


# -- helpers --------------------------------------------------------------------------------------------------


def _write_loadable(folder: Path, model, processor) -> None:
    """The model's config.json and the processor beside model.safetensors: the save_pretrained layout, so that
    `predict`, `evaluate` and transformers' `pipeline` load a checkpoint folder as they load model/."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(folder)
    if processor is not None and hasattr(processor, "save_pretrained"):
        processor.save_pretrained(folder)
    for path in folder.iterdir():  # fsync what the libraries wrote, as every other checkpoint file is
        if path.is_file():
            _write_to_path(path, lambda p: None)


def _write(path: Path, write) -> None:
    """Write a file through `write(binary_file)` and fsync it."""
    with path.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _write_to_path(path: Path, write) -> None:
    """Write a file through `write(path)` (for writers that open the file themselves) and fsync it."""
    write(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _crc32(path: Path, chunk: int = 16 << 20) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _torch_load(path: Path):
    return torch.load(path, weights_only=True, map_location="cpu")


def _load(path: Path, load):
    """Run a loader; any failure becomes a one-line CheckpointError naming the file."""
    import pickle

    try:
        return load(path)
    except pickle.UnpicklingError:  # torch.load(weights_only=True) refused an object that would run code
        raise CheckpointError(
            f"{path}: cannot be loaded: it holds Python objects that loading would have to run as code, which "
            "leantrain never does (not written by leantrain, or tampered with); resume from another checkpoint "
            "with --resume PATH"
        ) from None
    except Exception as exc:  # torch and safetensors raise many types for damaged or mismatched files
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
        # torch's state-dict error is a header ending in ':' and the keys below it: the keys say what differs
        first = (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:200]
        raise CheckpointError(
            f"{path}: cannot be loaded ({first}); it is damaged or from a different "
            "model/optimizer; resume from another checkpoint with --resume PATH"
        ) from None


def _gathered(model, optimizer):
    """A sharded run's (weights, optimizer state), whole on the main process (a collective); None unsharded."""
    from leantrain.parallel import sharding

    return sharding.full_state(model, optimizer) if sharding.is_sharded(model) else None


def _nothing() -> None:
    """A phase of a save that this process sits out (it still takes part in the phase's agreement)."""


def _state_bytes(model, optimizer) -> int:
    """What a checkpoint of this model and optimizer takes on disk, roughly: every tensor once, plus 1 MiB."""
    import itertools

    def tensors(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from tensors(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from tensors(v)

    state = optimizer.state_dict() if optimizer is not None else {}
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.state_dict().values(), tensors(state))) + (
        1 << 20
    )


def _contents(folder: Path, config: dict) -> dict[str, Any]:
    """The manifest's record of what a checkpoint holds: each file's size and checksum, paths as resolved,
    library versions."""
    return {
        "resolved_paths": {k: normalise_path(config[k]) for k in PATH_KEYS if k in config},
        "files": {p.name: {"bytes": p.stat().st_size, "crc32": _crc32(p)} for p in sorted(folder.iterdir())},
        "versions": _versions(),
    }


def _all_agree(accelerator, ok: bool) -> bool:
    """Whether `ok` holds on every process (a collective when there are several)."""
    if accelerator is None:
        return ok
    from leantrain.parallel import any_process

    return not any_process(accelerator, not ok)


def _versions() -> dict[str, str]:
    from leantrain._version import __version__

    return {"leantrain": __version__, "torch": torch.__version__}
