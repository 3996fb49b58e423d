"""The optimizers behind the registry's entries, built from explicit settings (`model/optimizers.py` reads the run's
settings, picks the hidden matrices and calls these): torch's AdamW, Muon on the hidden matrices with AdamW on the
rest as one optimizer, schedule-free AdamW and SGD, Lion, GaLore and APOLLO.

Libraries, chosen by what they compute and how they are kept (docs/techniques/optimizers.md has the measurements):
torch's own `Muon`; `schedulefree` (Meta's, the authors'); `pytorch-optimizer` for Lion and GaLore (maintained, a
batched path for the parameters it does not project); `apollo-torch` (the authors') for APOLLO, whose update
scales the *full* gradient by the low-rank estimate as the paper does and whose random projections come from a
per-parameter seed kept in its state (pytorch-optimizer's APOLLO scales the projected gradient and projects it back,
a rank-r update, and draws its projections from the global RNG, which each process moves differently).
"""

from __future__ import annotations

from typing import Any

import torch

#: Adam's epsilon for every Adam-like optimizer here: torch AdamW's, so that they differ from it only in their rule
ADAM_EPS = 1e-8


def fused_supported(device: torch.device) -> bool:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # private helper moved: fall back to the devices torch 2.4+ is known to fuse on
        return device.type in ("cpu", "cuda")


def torch_adamw(groups: list[dict], lr: float) -> torch.optim.Optimizer:
    """torch's AdamW, fused where it has the kernel."""
    # The fused kernel is about 4x faster than foreach on this CPU (25 ms vs 112 ms a step, 22.7 M params).
    if fused_supported(groups[0]["params"][0].device):
        try:
            return torch.optim.AdamW(groups, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            pass
    return torch.optim.AdamW(groups, lr=lr, foreach=True)


class Combined(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped, scheduled, saved and restored as one: its `param_groups`
    are theirs, in order (the same dicts, so a schedule sets each one's learning rate), and its `state` is one mapping
    they share, so `state_dict()` is torch's format over every parameter."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts
        super().__init__([g for part in parts for g in part.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Point each part at its slice of this optimizer's groups and at its state (again after a load, which
        makes new group dicts and a new state)."""
        start = 0
        for part in self.parts:
            n = len(part.param_groups)
            part.param_groups = self.param_groups[start : start + n]
            part.state = self.state
            start += n

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()


def muon(hidden: list[dict], rest: list[dict], lr: float, muon_lr: float, momentum: float, rule: str) -> Combined:
    """torch's Muon on the hidden matrices (Nesterov momentum, 5 Newton-Schulz steps, decoupled weight decay; `rule`
    sizes each matrix's update: match_rms_adamw makes its RMS AdamW's, so AdamW's learning rate carries over), and
    torch's AdamW on the rest."""
    parts: list[torch.optim.Optimizer] = [
        torch.optim.Muon(hidden, lr=muon_lr, momentum=momentum, nesterov=True, adjust_lr_fn=rule)
    ]
    if rest:
        parts.append(torch_adamw(rest, lr))
    return Combined(parts)


def schedule_free_adamw(groups: list[dict], lr: float) -> torch.optim.Optimizer:
    """Schedule-free AdamW: no schedule (the run's warm-up scales its learning rate), the weights evaluated are an
    average of the iterates, switched in with `.eval()` and out with `.train()`."""
    from schedulefree import AdamWScheduleFree

    return AdamWScheduleFree(groups, lr=lr, betas=(0.9, 0.999), eps=ADAM_EPS, warmup_steps=0)


def schedule_free_sgd(groups: list[dict], lr: float) -> torch.optim.Optimizer:
    from schedulefree import SGDScheduleFree

    return SGDScheduleFree(groups, lr=lr, momentum=0.9, warmup_steps=0)


def lion(groups: list[dict], lr: float) -> torch.optim.Optimizer:
    """Lion (sign of an interpolated momentum): one fp32 moment a parameter; its updates are ±lr a weight, so its
    learning rate is about 3-10x smaller than AdamW's."""
    from pytorch_optimizer import Lion

    return Lion(groups, lr=lr, betas=(0.9, 0.99), weight_decouple=True)


class ProjectorsAsTensors:
    """For GaLore and APOLLO: `state_dict()` holds each parameter's projector (a plain object: its projection
    matrix, rank, refresh interval, seed) as a dict of its tensors and numbers, which `torch.load(weights_only=True)`
    reads back (it refuses a pickled object), and `load_state_dict` builds the projectors again."""

    projector_class: Any

    def state_dict(self) -> dict[str, Any]:
        saved = super().state_dict()  # type: ignore[misc]
        saved["state"] = {
            k: {**s, "projector": dict(vars(s["projector"]))} if "projector" in s else s
            for k, s in saved["state"].items()
        }
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        params = [p for g in self.param_groups for p in g["params"]]  # type: ignore[attr-defined]
        for index, saved in state_dict["state"].items():
            if not isinstance(saved.get("projector"), dict):
                continue
            state = self.state[params[index]]  # type: ignore[attr-defined]
            # the tensors as torch's load cast them (to the parameter's device); the rest as saved (its cast turns
            # a string into a generator's repr)
            cast = state["projector"]
            projector = self.projector_class.__new__(self.projector_class)
            projector.__dict__.update(
                {k: cast[k] if isinstance(v, (torch.Tensor, tuple)) else v for k, v in saved["projector"].items()}
            )
            state["projector"] = projector


def galore(hidden: list[dict], rest: list[dict], lr: float, rank: int, interval: int, scale: float):
    """GaLore (pytorch-optimizer's): AdamW whose moments of each hidden matrix live in a rank-`rank` subspace of its
    gradient, found by SVD every `interval` steps; the update is projected back and scaled by `scale`."""
    from pytorch_optimizer import GaLore
    from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector

    class SavedGaLore(ProjectorsAsTensors, GaLore):
        projector_class = GaLoreProjector

    projected = [
        {**g, "rank": rank, "update_proj_gap": interval, "scale": scale, "projection_type": "std"} for g in hidden
    ]
    return SavedGaLore(projected + rest, lr=lr, betas=(0.9, 0.999), eps=ADAM_EPS)


def apollo(hidden: list[dict], rest: list[dict], lr: float, rank: int, interval: int, scale: float):
    """APOLLO (apollo-torch's, the authors'): each hidden matrix's gradient is projected by a random rank-`rank`
    matrix (new every `interval` steps, from a per-parameter seed), AdamW's moments are kept there only to estimate a
    per-channel scaling, and the full gradient is scaled by it (with Fira's norm-growth limiter)."""
    from apollo_torch import APOLLOAdamW
    from apollo_torch.random_projector import GradientProjector

    class SavedAPOLLO(ProjectorsAsTensors, APOLLOAdamW):
        projector_class = GradientProjector

    projected = [
        {
            **g,
            "rank": rank,
            "update_proj_gap": interval,
            "scale": scale,
            "proj": "random",
            "proj_type": "std",
            "scale_type": "channel",
        }
        for g in hidden
    ]
    return SavedAPOLLO(projected + rest, lr=lr, betas=(0.9, 0.999), eps=ADAM_EPS)
