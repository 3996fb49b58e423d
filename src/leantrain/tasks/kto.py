"""`--task kto`: Kahneman-Tversky optimisation on unpaired judgements: rows of `prompt`, `completion` and a boolean
`label` (true: desirable), each weighted by --desirable-weight or --undesirable-weight.

A desirable completion's loss is 1 - σ(β (r - z0)), an undesirable one's 1 - σ(β (z0 - r)), with r the policy's
log-ratio to the reference and z0 the KL baseline: the mean log-ratio of *mismatched* completions (each row's
prompt with another row's completion), clamped at 0 and without gradient (the KTO paper's estimate). Each row's
mismatched completion is fixed when the data is prepared (a seeded cycle through the rows, as TRL pairs them ahead
of training), and z0 is taken over the whole optimizer step before its micro-batches run (`Task.begin_step`,
all-reduced across processes), so accumulation and N processes compute the big batch's z0 and are exact. The loss
is the mean over the step's rows (TRL's `nanmean` of the weighted losses). The reference comes in the same three
forms as DPO's; with --precompute-reference the mismatched completions' reference log-probabilities are
precomputed too.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from leantrain.tasks.base import TaskData, TrainingContext
from leantrain.tasks.preference import PolicyOutputs, PolicyTask

#: the metrics logged in training and evaluation, TRL's KTOTrainer's names
KTO_METRICS = ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected")


def kto_losses(
    ratios: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor | float, beta: float, weights: tuple[float, float]
) -> torch.Tensor:
    """Each row's weighted loss from its log-ratio to the reference (rows,), whether it is desirable, the KL
    baseline z0 and the (desirable, undesirable) weights."""
    good = weights[0] * (1 - torch.sigmoid(beta * (ratios - kl)))
    bad = weights[1] * (1 - torch.sigmoid(beta * (kl - ratios)))
    return torch.where(desirable, good, bad)


def mismatched(n: int, seed: int) -> np.ndarray:
    """For each of `n` rows, another row whose completion it is paired with to estimate the KL baseline: a seeded
    cycle through all rows (never the row itself when there are two or more)."""
    order = np.random.default_rng([seed, 7]).permutation(n)
    partner = np.empty(n, dtype=np.int64)
    partner[order] = np.roll(order, -1)
    return partner


class KTO(PolicyTask):
    name: ClassVar[str] = "kto"
    aliases: ClassVar[tuple[str, ...]] = ()
    data_kind: ClassVar[str] = "judgements"
    aside: ClassVar[int] = 1
    metric_names: tuple[str, ...] = ("loss", *KTO_METRICS)

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.kl = torch.zeros(())  # z0 of the current step (`begin_step`)

    # -- data ------------------------------------------------------------------------------------------------------
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        data = super().prepare_data(model_path, model_config)
        desirable = int(np.asarray(data.train.labels).sum())
        if desirable in (0, len(data.train)):
            kind = "desirable (label true)" if desirable else "undesirable (label false)"
            data.notes.append(
                f"warning: every training row is {kind}: KTO then only pushes such completions "
                f"{'up' if desirable else 'down'}, and the other kind's rewards are undefined (NaN); give rows of both"
            )
        return data

    def finish(self, examples: Any) -> Any:
        """Each row's mismatched completion as a third part, cut so that prompt and it fit --max-length."""
        from leantrain.data.preferences import from_sequences

        partner = mismatched(len(examples), self.cfg.seed)
        rows = []
        for i in range(len(examples)):
            prompt, completion = examples.row(i)["parts"]
            other = examples.row(int(partner[i]))["parts"][1][: max(self.cfg.max_length - len(prompt), 1)]
            rows.append([prompt.tolist(), completion.tolist(), other.tolist()])
        return from_sequences(rows, {"desirable": examples.values["label"]})

    def labels_of(self, examples: Any) -> np.ndarray:
        return examples.values.get("desirable", examples.values.get("label")).astype(np.int64)

    # -- a step ----------------------------------------------------------------------------------------------------
    def begin_step(self, model: torch.nn.Module, batches: list[dict[str, Any]], context: TrainingContext) -> None:
        """z0 over the whole step: the mismatched completions' mean log-ratio, all processes' rows."""
        assert self.logps is not None
        total = torch.zeros(2, dtype=torch.float64, device=context.accelerator.device)
        with torch.no_grad():
            for i, batch in enumerate(batches):
                aside = batch["aside"]
                with context.host_masks(i, "aside"):
                    ratios = self.logps(model, aside).total - self.reference.logps(model, aside)
                total += torch.stack([ratios.double().sum(), torch.tensor(float(len(ratios)), device=total.device)])
        if context.accelerator.num_processes > 1:
            total = context.accelerator.reduce(total, reduction="sum")
        self.kl = (total[0] / total[1].clamp(min=1)).clamp(min=0).float()

    def _kl_of(self, outputs: PolicyOutputs) -> torch.Tensor:
        """z0: the step's in training (`begin_step`); in evaluation, where no step began, the batch's own."""
        return outputs.aside if outputs.aside is not None else self.kl.to(outputs.policy.total.device)

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> PolicyOutputs:
        outputs = super().forward(model, batch)
        if not torch.is_grad_enabled():  # evaluation: z0 from the evaluation batch's own mismatched completions
            assert self.logps is not None
            aside = batch["aside"]
            ratios = self.logps(model, aside).total - self.reference.logps(model, aside)
            outputs.aside = ratios.mean().clamp(min=0)
        return outputs

    def _row_values(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        assert outputs.reference is not None
        ratios = outputs.policy.total - outputs.reference
        desirable = batch["desirable"].bool()
        kl = self._kl_of(outputs)
        losses = kto_losses(ratios, desirable, kl, cfg.beta, (cfg.desirable_weight, cfg.undesirable_weight))
        return {"loss": losses, "ratio": ratios, "desirable": desirable, "logps": outputs.policy.total, "kl": kl}

    def loss_sum(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> torch.Tensor:
        return self._row_values(outputs, batch)["loss"].sum()

    def train_sums(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            rows = self._row_values(outputs, batch)
            good = rows["desirable"].float()
            rewards = self.cfg.beta * rows["ratio"]
            return {
                "rows": torch.tensor(float(len(good))),
                "chosen": good.sum(),
                "rejected": (1 - good).sum(),
                "kl": rows["kl"] * len(good),
                "rewards/chosen": (rewards * good).sum(),
                "rewards/rejected": (rewards * (1 - good)).sum(),
                "logps/chosen": (rows["logps"] * good).sum(),
                "logps/rejected": (rows["logps"] * (1 - good)).sum(),
            }

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return self._means(sums)

    @staticmethod
    def _means(sums: dict[str, float]) -> dict[str, float]:
        """Rewards and log-probabilities over the desirable rows (chosen) and the undesirable (rejected), as TRL's;
        NaN over none (a mean of no rows is undefined, not 0)."""
        out = {"kl": sums["kl"] / max(sums["rows"], 1.0)}
        for key in ("rewards", "logps"):
            for kind in ("chosen", "rejected"):
                out[f"{key}/{kind}"] = sums[f"{key}/{kind}"] / sums[kind] if sums[kind] else math.nan
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
        return out

    def eval_rows(self, outputs: PolicyOutputs, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        rows = self._row_values(outputs, batch)
        n = len(rows["loss"])
        return {
            "loss": rows["loss"].float(),
            "ratio": rows["ratio"].float(),
            "desirable": rows["desirable"].long(),
            "logps": rows["logps"].float(),
            "kl": rows["kl"].float().expand(n).clone(),
        }

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        good = rows["desirable"].astype(np.float64)
        rewards = self.cfg.beta * rows["ratio"]
        sums = {
            "rows": float(len(good)),
            "chosen": float(good.sum()),
            "rejected": float((1 - good).sum()),
            "kl": float(rows["kl"].sum()),
            "rewards/chosen": float((rewards * good).sum()),
            "rewards/rejected": float((rewards * (1 - good)).sum()),
            "logps/chosen": float((rows["logps"] * good).sum()),
            "logps/rejected": float((rows["logps"] * (1 - good)).sum()),
        }
        return {"loss": float(np.mean(rows["loss"])), **self._means(sums)}

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        return [
            ("eval loss (per row)", f"{metrics['loss']:.4f}"),
            ("eval reward margin", f"{metrics['rewards/margins']:.4f}"),
            ("eval KL baseline", f"{metrics['kl']:.4f}"),
        ]

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        return {**super().data_facts(data), "desirable": int(data.train.labels.sum())}
