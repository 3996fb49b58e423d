"""`--attention`: which attention kernel the model runs, chosen from measurements.

transformers lets one model run several attention implementations (`eager`: matmul, softmax, matmul in Python;
`sdpa`: torch's fused `scaled_dot_product_attention`; `flex_attention`: a compiled block-mask kernel). They give
the same results up to rounding (dropout aside, whose random draws differ), so the choice changes cost, not
results, and `auto` picks by what was measured:

- a GPU (H200, bf16, a packed 125 M Llama): SDPA 235k tokens/s, eager 95k, flex 38k (its mask recompiles per
  batch) -> sdpa;
- a CPU with AMX, bf16 training, attention dropout off: SDPA's CPU flash kernel took 43% of a step, eager ran 2x
  SDPA -> eager;
- a CPU without native bf16 (AMD EPYC), fp32: within 20% either way, no consistent winner -> sdpa;
- a CPU, a model with attention dropout, `--fast-dropout` (on by default): SDPA draws its dropout inside its kernel
  with torch's slow `bernoulli_`, eager attention through `model.dropout` -> eager.

Evaluations run no backward pass, and there SDPA's forward was the faster everywhere measured (a CPU, no grad:
MiniLM at length 128 in bf16 2x eager, in fp32 1.1-1.2x; a Llama 1.1x in bf16; a bert2bert's generation 1.1x): so
with `auto` evaluations (`leantrain evaluate` and `predict` too) run SDPA whatever trains (`for_evaluation`), but
for a compiled model (a switch would recompile) and a packed run (the packing guard checked the training kernel).

Sources: benchmarks/results/gpu_check/, benchmarks/results/attention.md (`python benchmarks/attention.py` on the
machine at hand). Never flex by default: it compiles per new shape. Packing stays safe with either choice: a
causal LM's packing guard runs after the choice (tasks/causal_lm.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from leantrain.errors import ConfigError

CHOICES = ("auto", "eager", "sdpa", "flex_attention")
ALIASES = {"flex": "flex_attention"}


def _attention_dropout(config: Any) -> float:
    for key in ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop"):
        value = getattr(config, key, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def _cpu_has_native_bf16() -> bool:
    from leantrain.parallel import precision_support

    return precision_support("cpu")["bf16"].fast


def choose(
    requested: str, model: Any, device_type: str, precision: str, fast_dropout: bool = False
) -> tuple[str | None, str]:
    """The implementation for training `model` (None: the model has no choice to make) and why; `fast_dropout`:
    the run draws CPU dropout masks itself (`model.dropout`)."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if current is None:
        return None, "the model does not choose its attention implementation"
    if requested == "flex_attention" and device_type == "cpu":  # measured: torch 2.13 refuses it mid-step
        raise ConfigError(
            "--attention flex_attention: flex attention has no backward pass on a CPU (torch's own limit); "
            "use --attention eager or sdpa"
        )
    if requested != "auto":
        return requested, "--attention"
    if device_type == "cuda":
        return "sdpa", "auto: SDPA is the fastest measured on a GPU"
    if fast_dropout and _attention_dropout(model.config) > 0:
        return "eager", "auto: on a CPU eager attention draws its dropout 16 bits a number (--fast-dropout), SDPA not"
    if precision == "bf16" and _attention_dropout(model.config) == 0 and _cpu_has_native_bf16():
        return "eager", "auto: on a CPU with native bf16, SDPA's flash kernel measured 2x slower than eager"
    return "sdpa", "auto: on this CPU and precision SDPA is as fast as eager"


def apply(model: Any, name: str, forced: bool = True) -> str:
    """Switch `model` (and its submodules) to attention `name` and return the one that runs. A forced choice the
    model cannot run is one line; auto's choice then falls back to the model's own implementation."""
    current = model.config._attn_implementation
    if current == name:
        return name
    try:
        model.set_attn_implementation(name)
    except (ValueError, ImportError) as exc:
        if not forced:
            return current
        reason = str(exc).splitlines()[0][:200]
        raise ConfigError(
            f"--attention {name}: {type(model).__name__} cannot run it ({reason}); use --attention eager or sdpa"
        ) from None
    return name


def set_up(
    model: Any, setting: str, device_type: str, precision: str, fast_dropout: bool = False
) -> tuple[str | None, str]:
    """Choose (`choose`) and switch to (`apply`) the kernel `setting` asks for; returns the one that runs (None: the
    model has no choice) and why."""
    name, why = choose(setting, model, device_type, precision, fast_dropout)
    if name is None:
        return None, why
    running = apply(model, name, forced=setting != "auto")
    if running != name:
        why = f"{name} was chosen ({why}), but {type(model).__name__} cannot run it"
    return running, why


def for_evaluation(model: Any, setting: str, training: str | None, *, packing: bool, compiled: bool) -> str | None:
    """The kernel `model` is evaluated with when it trains with `training`: SDPA under `auto` where the model runs
    it (module doc), else the training kernel. The trainer and `evaluate`/`predict` both call this, so a run's model
    is scored with the kernel it was evaluated with in training. Leaves the model running `training`."""
    if training is None or setting != "auto" or packing or compiled or training == "sdpa":
        return training
    runs = apply(model, "sdpa", forced=False)
    apply(model, training)
    return runs


@contextlib.contextmanager
def running(model: Any, name: str | None) -> Iterator[None]:
    """Within the block `model` runs attention `name` (None: as it is), its own kernel again after."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if name is None or current is None or name == current:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(current)
