"""What report.html's plots cost: the five figures with fixed margins (leantrain's) against matplotlib's
constrained layout (what leantrain used before), on one real run, in one process.

Every run ends by writing report.html, so its cost is paid by every user at the end of every run (and by the
test suite, hundreds of times). The run: a 2-layer BERT from a config with MiniLM's tokenizer, one epoch of
SST-2 train_1k with a log row per step and evaluation every 8 steps (or `--run-dir`, any finished run).
Variants alternate, after one warm-up each; medians.

    python benchmarks/report_plots.py              # writes benchmarks/results/report_plots.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` as a package when run as a script
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2" / "train_1k.tsv"
RESULTS = REPO / "benchmarks" / "results"


def make_run(root: Path, data: Path) -> Path:
    """A finished tiny run with a row per step, evaluations, the time breakdown and memory."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from leantrain import TrainConfig, train
    from leantrain.model.loading import embedded_model_path

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    BertForSequenceClassification(config).save_pretrained(root / "model")
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(root / "model")
    cfg = TrainConfig(
        model=str(root / "model"), data=str(data), output_dir=str(root / "run"), batch_size=32, max_length=64,
        log_every=1, eval_every=8, progress=False, report=False,
    )  # fmt: skip
    train(cfg)
    return root / "run"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--run-dir", type=Path, help="a finished run to plot (default: train a tiny one)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import matplotlib
    import torch

    from leantrain.run import report

    run_dir = args.run_dir or make_run(Path(tempfile.mkdtemp(prefix="report-plots-")), args.data)
    run = report.load_run(run_dir)
    fixed = report._figure

    def constrained(*a, **k):
        fig, axes = fixed(*a, **k)
        fig.set_layout_engine("constrained")  # the engine then places the plots itself, as before
        return fig, axes

    variants = {"fixed margins": fixed, "constrained layout": constrained}
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.repeats + 1):
        for name, figure in variants.items():
            report._figure = figure
            start = time.perf_counter()
            drawn = [plot(run) for _, _, plot in report.PLOTS]
            if i:  # the first round warms up (fonts, caches)
                times[name].append(time.perf_counter() - start)
    report._figure = fixed
    median = {name: statistics.median(ts) for name, ts in times.items()}
    context = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "matplotlib": matplotlib.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load average before / after": f"{load_before[0]:.1f} / {os.getloadavg()[0]:.1f}",
        "run": f"{len(run.rows)} metrics rows, {sum(d is not None for d in drawn)} figures",
        "command": "python benchmarks/report_plots.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    ratio = median["constrained layout"] / median["fixed margins"]
    lines = [
        "# report.html's plots: fixed margins against constrained layout",
        "",
        f"The five figures of one run, drawn to PNG; median of {args.repeats} alternating rounds after a warm-up.",
        "",
        "| layout | seconds for the five plots |",
        "|---|---|",
        *[f"| {name} | {median[name]:.3f} |" for name in variants],
        "",
        f"Constrained layout takes {ratio:.2f}x as long.",
    ]
    print(json.dumps({"median_seconds": median, "ratio": ratio}))
    from benchmarks._results import write_results

    print(write_results(args.out, "report_plots", lines, context, {"median_seconds": median, "times": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
