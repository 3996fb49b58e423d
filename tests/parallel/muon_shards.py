"""One Muon step of a 128 x 64 matrix sharded by rows across two processes (FSDP2), against the unsharded step and
against orthogonalising each process's rows apart; run by tests/parallel/test_data_parallel.py under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/parallel/muon_shards.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

LR, RULE = 0.01, "match_rms_adamw"


def step(weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """`weight` after one Muon step with gradient `grad` (unsharded)."""
    p = torch.nn.Parameter(weight.clone())
    p.grad = grad.clone()
    torch.optim.Muon([p], lr=LR, adjust_lr_fn=RULE).step()
    return p.detach()


def main(out: str) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 128, bias=False)
    start, grad = layer.weight.detach().clone(), torch.randn(128, 64)
    whole = step(start, grad)
    per_shard = torch.cat([step(w, g) for w, g in zip(start.chunk(2), grad.chunk(2))])  # each half on its own
    model = torch.nn.Sequential(layer)
    fully_shard(model)
    weight = model[0].weight
    weight.grad = distribute_tensor(grad.clone(), weight.device_mesh, weight.placements)
    torch.optim.Muon([weight], lr=LR, adjust_lr_fn=RULE).step()
    sharded = weight.full_tensor()
    if dist.get_rank() == 0:
        result = {
            "placements": str(weight.placements),
            "sharded_vs_whole": (sharded - whole).abs().max().item(),
            "per_shard_vs_whole": (per_shard - whole).abs().max().item(),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
