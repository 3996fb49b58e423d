"""Run `leantrain train` in one process of a torchrun job and record what this process saw.

Usage: torchrun --nproc-per-node N tests/parallel/probe.py OUT train FLAGS...

Writes OUT.<rank>.pt with: the model's parameters before the first step ("init"), every training
micro-batch this rank fed to the model, with its epoch ("batches"), and for each evaluation the
indices this rank was given ("eval_local") and the gathered indices it computed metrics on
("eval_gathered"). The training itself is the real loop, unchanged: only two functions are wrapped.
"""

from __future__ import annotations

import os
import sys

import torch

import leantrain.data.batching as batching
import leantrain.training.evaluate as evaluate
import leantrain.training.loop as loop
from leantrain.cli import main

out, argv = sys.argv[1], sys.argv[2:]
rank = int(os.environ.get("RANK", 0))
record: dict = {"init": None, "batches": [], "eval_local": [], "eval_gathered": []}
epoch = [0]

original_set_epoch = batching.GlobalBatchSampler.set_epoch


def set_epoch(self, e):
    epoch[0] = e
    return original_set_epoch(self, e)


original_forward_backward = loop.forward_backward_step


def forward_backward_step(model, batch, accelerator, amp):
    if record["init"] is None:
        inner = accelerator.unwrap_model(model)
        record["init"] = {k: v.detach().clone() for k, v in inner.state_dict().items()}
    record["batches"].append({"epoch": epoch[0], **{k: v.detach().clone() for k, v in batch.items()}})
    return original_forward_backward(model, batch, accelerator, amp)


original_predict = evaluate.predict_loop


def predict_loop(model, loader, accelerator):
    record["eval_local"].append([i for b in loader for i in b["index"].tolist()])
    probs, labels, indices = original_predict(model, loader, accelerator)
    record["eval_gathered"].append(indices.tolist())
    return probs, labels, indices


batching.GlobalBatchSampler.set_epoch = set_epoch
loop.forward_backward_step = forward_backward_step
evaluate.predict_loop = predict_loop
try:
    code = main(argv)
finally:
    torch.save(record, f"{out}.{rank}.pt")
sys.exit(code)
