"""Fixed-seed runs of every workload, fingerprinted: proof that a refactoring changed no behaviour.

    python benchmarks/behaviour_fingerprint.py record OUT_DIR [JOB ...]  # run the jobs (all, or these), keep
                                                                         # their weights and metrics
    python benchmarks/behaviour_fingerprint.py compare BEFORE AFTER [--markdown FILE]

Jobs (tiny models, real data from ../shared/data, CPU, fp32): text single (SST-2), text pairs (MRPC),
image (MNIST, preset:tiny-vit), audio (FSDD, preset:tiny-audio), gradient accumulation, two processes and a
resumed run. `compare` prints, per job, whether the final weights are bitwise equal (else the largest
difference) and whether metrics.json has the same keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
COMMON = ["--precision", "fp32", "--seed", "7", "--no-progress", "--no-report", "--log-every", "1"]


def tiny_bert(root: Path) -> Path:
    """A 2-layer BERT with random weights (dropout on) and MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from leantrain.model.loading import embedded_model_path

    path = root / "tiny-bert"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        BertModel(cfg).save_pretrained(path)
        AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(path)
    return path


def jobs(root: Path) -> dict[str, list[list[str]]]:
    bert = str(tiny_bert(root))
    sst2 = ["--model", bert, "--data", str(DATA / "sst2" / "train_1k.tsv"), "--limit", "300", "--max-steps", "6"]
    mrpc = ["--model", bert, "--data", str(DATA / "mrpc" / "train.tsv"), "--limit", "200", "--max-steps", "5"]
    mnist = ["--model", "preset:tiny-vit", "--data", str(DATA / "mnist_test"), "--limit", "200", "--max-steps", "4"]
    fsdd = ["--model", "preset:tiny-audio", "--data", str(DATA / "fsdd" / "recordings"), "--label-pattern",
            r"^(\d+)_", "--limit", "120", "--max-steps", "3", "--max-seconds", "1"]  # fmt: skip
    out = lambda name: ["--output-dir", str(root / "runs" / name)]  # noqa: E731
    return {
        "text-single": [[*sst2, "--batch-size", "16", *out("text-single")]],
        "text-pair": [[*mrpc, "--batch-size", "16", *out("text-pair")]],
        "image": [[*mnist, "--batch-size", "16", *out("image")]],
        "audio": [[*fsdd, "--batch-size", "16", *out("audio")]],
        "grad-accum": [[*sst2, "--batch-size", "8", "--grad-accum", "2", *out("grad-accum")]],
        "two-processes": [[*sst2, "--batch-size", "8", "--num-processes", "2", *out("two-processes")]],
        "resume": [
            [*sst2, "--batch-size", "16", "--save-every", "3", *out("resume-whole")],
            [
                *sst2,
                "--batch-size",
                "16",
                "--save-every",
                "3",
                *out("resume"),
                "--resume",
                str(root / "runs" / "resume-whole" / "checkpoints" / "step-000003"),
            ],
        ],
    }


def record(root: Path, only: list[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LEANTRAIN_CACHE": str(root / "cache")}
    done_before = root / "fingerprint.json"
    summary = json.loads(done_before.read_text()) if only and done_before.is_file() else {}
    for name, commands in jobs(root).items():
        if only and name not in only:
            continue
        for args in commands:
            cmd = [sys.executable, "-m", "leantrain", "train", *args, *COMMON, "--cache-dir", str(root / "cache")]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
        run = root / "runs" / name
        weights = (run / "model" / "model.safetensors").read_bytes()
        metrics = json.loads((run / "metrics.json").read_text())
        summary[name] = {"sha256": hashlib.sha256(weights).hexdigest(), "metrics_keys": sorted(metrics)}
        print(f"{name}: {summary[name]['sha256'][:16]}", flush=True)
        (root / "fingerprint.json").write_text(json.dumps(summary, indent=1) + "\n")  # after each job


def compare(before: Path, after: Path, markdown: Path | None) -> int:
    from safetensors.torch import load_file

    a, b = (json.loads((p / "fingerprint.json").read_text()) for p in (before, after))
    rows, bad = ["| job | weights | metrics.json keys |", "|---|---|---|"], 0
    for name in a:
        if a[name]["sha256"] == b[name]["sha256"]:
            weights = "bitwise equal"
        else:
            wa, wb = (load_file(p / "runs" / name / "model" / "model.safetensors") for p in (before, after))
            diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa) if wa.keys() == wb.keys() else 1
            weights = f"max difference {diff:.2g}"
            bad += diff > 1e-6
        keys = "same" if a[name]["metrics_keys"] == b[name]["metrics_keys"] else (
            f"added {sorted(set(b[name]['metrics_keys']) - set(a[name]['metrics_keys']))}, "
            f"removed {sorted(set(a[name]['metrics_keys']) - set(b[name]['metrics_keys']))}"
        )  # fmt: skip
        rows.append(f"| {name} | {weights} | {keys} |")
    print("\n".join(rows))
    if markdown:
        markdown.write_text("\n".join(rows) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(Path(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1:2] == ["compare"]:
        md = Path(sys.argv[sys.argv.index("--markdown") + 1]) if "--markdown" in sys.argv else None
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3]), md))
    else:
        sys.exit(__doc__)
