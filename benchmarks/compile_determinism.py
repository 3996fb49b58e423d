"""What `--compile`'s bitwise repeatability on a CPU costs a step: torch's deterministic algorithms off against on
(leantrain turns them on for a compiled CPU run: `leantrain.training.determinism`).

One process, a tiny BERT classifier (2 layers, width 64, BERT's vocabulary; random weights), batch 16 of length 32,
bf16 autocast, compiled; a step is forward, backward, AdamW, clear. Both graphs are compiled first (dynamo guards on
the setting), then the two settings alternate, --steps steps each, --rounds times; medians and the paired ratio.

    python benchmarks/compile_determinism.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.utils.deterministic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    model = BertForSequenceClassification(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    compiled = torch.compile(model)
    ids = torch.randint(1000, 30000, (16, 32))
    labels = torch.randint(0, 2, (16,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def setting(on: bool) -> None:
        torch.use_deterministic_algorithms(on, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # as leantrain

    times: dict[bool, list[float]] = {False: [], True: []}
    for on in (False, True):
        setting(on)
        for _ in range(2):  # compiles this setting's graphs
            step()
    for r in range(args.rounds):
        for on in (False, True) if r % 2 else (True, False):
            setting(on)
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[on].append((time.perf_counter() - started) / args.steps * 1000)
    for on, name in ((False, "default"), (True, "deterministic")):
        print(f"{name:>13}: median {statistics.median(times[on]):.2f} ms a step, fastest {min(times[on]):.2f}")
    ratios = [b / a for a, b in zip(times[False], times[True], strict=True)]
    print(f"deterministic / default, paired median: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
