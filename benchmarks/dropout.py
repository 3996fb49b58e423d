"""What dropout costs a training step on this CPU: torch's `bernoulli_` against leantrain's 16-bit draws
(`leantrain.model.dropout`), with eager and SDPA attention, on the embedded MiniLM.

One process; for each precision the cases run in alternation, a training step each (forward, backward, fused AdamW,
clear), on the same batch (random token ids, a quarter of the rows padded by a quarter), --rounds times after a
warm-up; the median per case, and the ratio to torch's dropout with SDPA (what `--attention auto` ran before).
Sequence classification (the default job's) and token classification (a head at every token).

    python benchmarks/dropout.py                      # writes benchmarks/results/dropout.{json,md}
    python benchmarks/dropout.py --rounds 5 --precisions fp32    # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from benchmarks._results import write_results  # noqa: E402

#: (dropout, attention): torch's dropout with SDPA is what ran before
CASES = (("torch", "sdpa"), ("torch", "eager"), ("fast", "sdpa"), ("fast", "eager"))


def run(precision: str, task: str, batch: int, length: int, rounds: int) -> dict:
    import contextlib

    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from leantrain.model.dropout import fast_dropout
    from leantrain.model.loading import embedded_model_path

    auto = AutoModelForTokenClassification if task == "token" else AutoModelForSequenceClassification
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[batch * 3 // 4 :, length * 3 // 4 :] = 0
    shape = (batch, length) if task == "token" else (batch,)
    labels = torch.randint(0, 3, shape, generator=gen)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    steps = {}
    for kind, attention in CASES:
        torch.manual_seed(0)
        model = auto.from_pretrained(str(embedded_model_path()), num_labels=3, attn_implementation=attention).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

        def step(model=model, optimizer=optimizer, kind=kind) -> float:
            started = time.perf_counter()
            with fast_dropout(kind == "fast"):
                with autocast():
                    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - started

        steps[(kind, attention)] = step
    times: dict[tuple[str, str], list[float]] = {case: [] for case in CASES}
    for step in steps.values():
        step()
        step()  # warm-up
    for _ in range(rounds):
        for case, step in steps.items():
            times[case].append(step())
    base = statistics.median(times[("torch", "sdpa")])
    return {
        "precision": precision,
        "task": task,
        "cases": [
            {
                "dropout": kind,
                "attention": attention,
                "ms": round(1000 * statistics.median(times[(kind, attention)]), 1),
                "speed_vs_before": round(base / statistics.median(times[(kind, attention)]), 3),
            }
            for kind, attention in CASES
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "bf16"])
    p.add_argument("--tasks", type=lambda s: s.split(","), default=["sequence", "token"])
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    import torch
    import transformers

    load_before = os.getloadavg()[0]
    results = [run(pr, t, a.batch, a.length, a.rounds) for pr in a.precisions for t in a.tasks]
    context = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": " ".join(
            f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in Path("/proc/cpuinfo").read_text()
        ),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", "(default)"),
        "load average before / after": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/dropout.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    lines = [
        "# Dropout on a CPU: torch's bernoulli_ against 16-bit draws",
        "",
        f"The embedded MiniLM, a training step (forward, backward, fused AdamW, clear) at batch {a.batch}, length "
        f"{a.length} (a quarter of the rows padded by a quarter), dropout as shipped (0.1 hidden, 0.1 attention); "
        f"median of {a.rounds} alternating steps per case in one process. x before: speed against torch's dropout "
        "with SDPA attention.",
        "",
        "| precision | head | dropout | attention | ms/step | x before |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in results:
        for c in r["cases"]:
            lines.append(
                f"| {r['precision']} | {r['task']} | {c['dropout']} | {c['attention']} | {c['ms']} | "
                f"{c['speed_vs_before']:.2f} |"
            )
    write_results(a.out_dir, "dropout", lines, context, {"results": results})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
