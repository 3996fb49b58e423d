"""Run `leantrain train` in one process of a torchrun job and record what this process saw.

Usage: torchrun --nproc-per-node N tests/parallel/probe.py OUT train FLAGS...

Writes OUT.<rank>.pt with: the model's parameters before the first step ("init"), every training
micro-batch this rank fed to the model, with its epoch ("batches"), and for each evaluation the
indices this rank was given ("eval_local") and the gathered indices it computed metrics on
("eval_gathered"). The training itself is the real trainer, unchanged: it only reports to these hooks.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import leantrain.api as api
import leantrain.data.batching as batching
from leantrain.commands.cli import main
from leantrain.training import Hooks

out, argv = sys.argv[1], sys.argv[2:]
rank = int(os.environ.get("RANK", 0))
record: dict = {"init": None, "batches": [], "eval_local": [], "eval_gathered": []}
epoch = [0]

original_set_epoch = batching.GlobalBatchSampler.set_epoch


def set_epoch(self, e):
    epoch[0] = e
    return original_set_epoch(self, e)


class Recorder(Hooks):
    def __init__(self):
        self.eval_local: list[int] = []

    def on_micro_batch(self, model, batch):
        if record["init"] is None:
            inner = getattr(model, "module", model)
            record["init"] = {k: v.detach().clone() for k, v in inner.state_dict().items()}
        record["batches"].append({"epoch": epoch[0], **{k: v.detach().clone() for k, v in batch.items()}})

    def on_eval_batch(self, batch):
        self.eval_local += batch["index"].tolist()

    def on_evaluated(self, rows):
        record["eval_local"].append(self.eval_local)
        record["eval_gathered"].append(rows["index"].tolist())
        self.eval_local = []


original_train = api.train


def train(config=None, **kwargs):
    return original_train(config, **{**kwargs, "hooks": Recorder()})


batching.GlobalBatchSampler.set_epoch = set_epoch
api.train = train
try:
    code = main(argv)
finally:
    torch.save(record, f"{out}.{rank}.pt")
sys.exit(code)
