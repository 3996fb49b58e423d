"""Does bitsandbytes run 4-bit and 8-bit Linear layers on this CPU, and what does merging a QLoRA adapter cost?

    python benchmarks/qlora_cpu.py            # ~3-5 min on 2 busy cores

1. One MiniLM-sized Linear layer (384 -> 1536, batch 32 x 64 tokens): bitsandbytes `Linear4bit` (NF4, fp32
   compute) and `Linear8bitLt` (int8, no fp16 weights) against fp32 `nn.Linear`: does forward and backward run,
   the output's relative error, forward+backward time (median of 20), weight bytes.
2. The embedded MiniLM trained for a few LoRA steps on SST-2 (train_1k) with `--quantize 4bit|8bit`: the
   published `model/` (adapter merged into the dequantized base) against the quantized base with the adapter on
   top, as it trained, on all 872 dev sentences: largest logit difference and prediction agreement.

Writes benchmarks/results/qlora_cpu.md and .json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SST2 = REPO.parent / "shared" / "data" / "sst2"
RESULTS = REPO / "benchmarks" / "results"


def layer_probe() -> dict:
    from leantrain.model.lora import _quantized_linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 1536)
    x = torch.randn(32 * 64, 384)
    ref = linear(x)
    out: dict = {}
    for bits in ("fp32", "4bit", "8bit"):
        try:
            layer = linear if bits == "fp32" else _quantized_linear(linear, bits, torch.device("cpu"))
            times = []
            for _ in range(20):
                xx = x.clone().requires_grad_(True)
                t = time.perf_counter()
                y = layer(xx)
                y.sum().backward()
                times.append(time.perf_counter() - t)
            weight = layer.weight
            out[bits] = {
                "runs": True,
                "relative_error": float((y.detach() - ref).norm() / ref.norm()),
                "forward_backward_ms": 1e3 * statistics.median(times),
                "weight_bytes": weight.numel() * weight.element_size(),
                "weight_dtype": str(weight.dtype),
            }
        except Exception as exc:
            out[bits] = {"runs": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def merge_probe(bits: str, work: Path) -> dict:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from leantrain import TrainConfig, train
    from leantrain.model import lora
    from leantrain.model.loading import embedded_model_path

    result = train(
        TrainConfig(
            data=str(SST2 / "train_1k.tsv"),
            eval_data=str(SST2 / "dev.tsv"),
            output_dir=str(work / bits),
            cache_dir=str(work / "cache"),
            lora=True,
            quantize=bits,
            save_adapter=True,
            max_steps=10,
            batch_size=16,
            lr=1e-3,
            max_length=64,
            precision="fp32",
            progress=False,
            report=False,
        )
    )
    merged = AutoModelForSequenceClassification.from_pretrained(result.model_dir).eval()
    base = AutoModelForSequenceClassification.from_pretrained(embedded_model_path(), num_labels=2)
    lora.quantize_base(base, bits, lora.head_modules(base), torch.device("cpu"))
    quantized = PeftModel.from_pretrained(base, result.output_dir / "adapter").eval()
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    sentences = [line.split("\t")[0] for line in (SST2 / "dev.tsv").read_text().splitlines()[1:]]
    diffs, agree, largest = [], 0, 0.0
    with torch.no_grad():
        for i in range(0, len(sentences), 64):
            x = tokenizer(sentences[i : i + 64], padding=True, truncation=True, max_length=64, return_tensors="pt")
            a, b = merged(**x).logits, quantized(**x).logits
            diffs.append((a - b).abs().max().item())
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            largest = max(largest, b.abs().max().item())
    return {
        "eval_accuracy": result.metrics["eval_accuracy"],
        "weights_bytes": result.metrics["weights_bytes"],
        "max_logit_difference": max(diffs),
        "largest_logit": largest,
        "prediction_agreement": agree / len(sentences),
        "sentences": len(sentences),
    }


def main() -> None:
    import bitsandbytes

    from leantrain.parallel import cpu_name

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    work = Path(tempfile.mkdtemp(prefix="qlora-"))
    report = {
        "versions": {"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__},
        "cpu": cpu_name(),
        "load": os.getloadavg(),
        "layer": layer_probe(),
    }
    report["merge"] = {bits: merge_probe(bits, work) for bits in ("4bit", "8bit")} if SST2.is_dir() else {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "qlora_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# bitsandbytes on this CPU: 4-bit and 8-bit layers, and the QLoRA merge",
        "",
        f"bitsandbytes {report['versions']['bitsandbytes']}, torch {report['versions']['torch']}, {report['cpu']}, "
        f"1 thread, load average {report['load']}. Written by `benchmarks/qlora_cpu.py`.",
        "",
        "| layer 384 -> 1536, 2048 rows | runs (fwd + bwd) | relative error | fwd+bwd ms | weight bytes |",
        "|---|---|---|---|---|",
    ]
    for bits, r in report["layer"].items():
        if r["runs"]:
            lines.append(
                f"| {bits} | yes | {r['relative_error']:.2e} | {r['forward_backward_ms']:.1f} | "
                f"{r['weight_bytes']:,} ({r['weight_dtype']}) |"
            )
        else:
            lines.append(f"| {bits} | no: {r['error']} | | | |")
    lines += [
        "",
        "| MiniLM, 10 LoRA steps, quantized base | dev accuracy | weights | merged model/ vs quantized base + "
        "adapter: max logit diff (largest logit) | same prediction |",
        "|---|---|---|---|---|",
    ]
    for bits, r in report["merge"].items():
        lines.append(
            f"| {bits} | {r['eval_accuracy']:.4f} | {r['weights_bytes'] / 2**20:.1f} MiB | "
            f"{r['max_logit_difference']:.2e} ({r['largest_logit']:.2f}) | "
            f"{r['prediction_agreement']:.2%} of {r['sentences']} |"
        )
    (RESULTS / "qlora_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
