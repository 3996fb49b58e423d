"""`preset:tiny-llama` continued pretraining on a mixture of two real corpora, beside a run on each alone.

The corpora: the embedded tweet corpus's texts and the SMS Spam Collection's texts (labels dropped), one document a
text; 5% of each held out (seed 0) as its own evaluation file. Three runs of the same model from scratch (tiny-llama's
config with one BPE tokenizer fitted on both training sets, so perplexities compare across runs), the same steps,
batch and schedule:

- mixture: tweets 0.8, SMS 0.2 by tokens (`--mix-by tokens`), each source evaluated on its own held-out file;
- tweets alone, and SMS alone.

Every run's model is then scored on both held-out files (`leantrain.inference.evaluate`). What the mixture should
show: the SMS perplexity close to the SMS-alone run's while the tweets' perplexity approaches the tweets-alone run's,
where each single-source run is far off on the other corpus; and realised token shares at the weights.

    python benchmarks/mixture_lm.py                     # 3 x 300 steps of 16 x 128 tokens (about 6 min on 2 cores)
    python benchmarks/mixture_lm.py --steps 20 --max-length 64 --batch-size 8   # a smoke test

Writes benchmarks/results/mixture_lm.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
WEIGHTS = {"tweets": 0.8, "sms": 0.2}


def corpora() -> dict[str, list[str]]:
    """Each corpus's texts, white space normalised, empty ones dropped."""
    from leantrain.data.sources import embedded_data_path, read_table

    tweets, _ = read_table(str(embedded_data_path()))  # leantrain's reader: the file is not all UTF-8
    with (SHARED / "sms_spam" / "SMSSpamCollection").open(encoding="utf-8", newline="") as f:
        sms = [row[1] for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if len(row) >= 2]
    texts = {"tweets": [str(t) for t in tweets["text"].dropna()], "sms": sms}
    return {name: [d for d in (" ".join(t.split()) for t in group) if d] for name, group in texts.items()}


def write_splits(texts: dict[str, list[str]], work: Path, held_out: float = 0.05) -> dict[str, dict[str, Path]]:
    """NAME_train.csv and NAME_dev.csv (one `text` column) for each corpus: a seeded 5% held out."""
    out = {}
    for name, docs in texts.items():
        order = np.random.default_rng(0).permutation(len(docs))
        cut = round(len(docs) * held_out)
        parts = {"dev": order[:cut], "train": order[cut:]}
        out[name] = {}
        for part, rows in parts.items():
            path = work / f"{name}_{part}.csv"
            with path.open("w", encoding="utf-8", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["text"])
                writer.writerows([docs[i]] for i in sorted(rows))
            out[name][part] = path
    return out


def shared_model(splits: dict[str, dict[str, Path]], folder: Path) -> Path:
    """tiny-llama's config (no weights: trained from scratch) and one BPE fitted on both training sets."""
    from leantrain.data.lm import train_bpe_tokenizer
    from leantrain.model import presets
    from leantrain.tasks.causal_lm import PRESET_VOCAB_SIZE

    docs = []
    for files in splits.values():
        with files["train"].open(encoding="utf-8", newline="") as f:
            docs += [row[0] for row in list(csv.reader(f))[1:]]
    tokenizer = train_bpe_tokenizer(docs, PRESET_VOCAB_SIZE)
    tokenizer.save_pretrained(folder)
    presets.preset_config("preset:tiny-llama", vocab_size=len(tokenizer)).save_pretrained(folder)
    return folder


def runs(args, splits, model: Path, work: Path) -> dict[str, dict]:
    from leantrain import TrainConfig, train

    common = dict(
        model=str(model),
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_steps=args.steps,
        lr=3e-3,
        warmup_ratio=0.05,
        scheduler="cosine",
        metric_for_best="loss",
        text_column="text",
        cache_dir=str(work / "cache"),
        overwrite=True,
        progress=False,
        seed=args.seed,
    )
    mixture = [
        {"path": str(splits[n]["train"]), "name": n, "weight": w, "eval_data": str(splits[n]["dev"])}
        for n, w in WEIGHTS.items()
    ]
    jobs = {  # report.html of the mixture only: its curve per source
        "mixture": dict(data=mixture, mix_by="tokens", report=True),
        "tweets alone": dict(data=str(splits["tweets"]["train"]), eval_data=str(splits["tweets"]["dev"]), report=False),
        "sms alone": dict(data=str(splits["sms"]["train"]), eval_data=str(splits["sms"]["dev"]), report=False),
    }
    out = {}
    for name, job in jobs.items():
        started, load = time.perf_counter(), os.getloadavg()
        result = train(TrainConfig(**common, **job, output_dir=str(work / name.replace(" ", "_"))))
        out[name] = {"result": result, "seconds": time.perf_counter() - started, "load_at_start": load}
    return out


def scores(done: dict[str, dict], splits) -> dict[str, dict]:
    """Each run's held-out perplexity on each corpus, its tokens/s and shares: the run's own evaluation of its
    sources' files (`evaluate` scores them alike: tests/tasks/test_causal_lm.py), `evaluate` on the other's file."""
    from leantrain.inference import evaluate

    table = {}
    for name, run in done.items():
        result = run["result"]
        row = {
            "seconds": round(run["seconds"], 1),
            "load_at_start": " ".join(f"{x:.1f}" for x in run["load_at_start"]),
            "train_tokens_per_second": result.metrics.get("train_tokens_per_second"),
            "steady_tokens_per_second": result.metrics.get("steady_tokens_per_second"),
        }
        sources = result.metrics.get("sources") or {}
        for corpus, files in splits.items():
            own = sources.get(corpus, {}).get("eval_perplexity")
            if own is None and name.startswith(corpus):
                own = result.metrics["eval_perplexity"]
            if own is None:
                own = evaluate(str(result.model_dir), str(files["dev"]))["perplexity"]
            row[f"{corpus}_perplexity"] = own
        for corpus, facts in sources.items():
            row[f"{corpus}_share_tokens"] = facts["share_tokens"]
            row[f"{corpus}_share_examples"] = facts["share_examples"]
            row[f"{corpus}_epochs"] = facts["epochs"]
        table[name] = row
    return table


def page(table: dict[str, dict], args, sizes: dict[str, int]) -> list[str]:
    mix, tweets, sms = table["mixture"], table["tweets alone"], table["sms alone"]
    lines = [
        "# A language model on a mixture of two corpora",
        "",
        f"`python benchmarks/mixture_lm.py --steps {args.steps} --batch-size {args.batch_size} --max-length "
        f"{args.max_length}`: `preset:tiny-llama`'s config from scratch, one BPE tokenizer (8,192) fitted on both "
        f"training sets; the embedded tweets ({sizes['tweets']:,} texts) and the SMS Spam Collection's texts "
        f"({sizes['sms']:,}), 5% of each held out. Each run: {args.steps} steps of {args.batch_size} packed rows of "
        f"{args.max_length} tokens, lr 3e-3 cosine, seed {args.seed}. Held-out perplexity (`leantrain evaluate` on "
        "each corpus's held-out file):",
        "",
        "| run | tweets perplexity | SMS perplexity | tokens drawn (tweets / SMS) | seconds | steady tokens/s "
        "| load at start |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in table.items():
        drawn = (
            f"{row['tweets_share_tokens']:.3f} / {row['sms_share_tokens']:.3f} (asked 0.8 / 0.2)"
            if "tweets_share_tokens" in row
            else ("1 / 0" if name.startswith("tweets") else "0 / 1")
        )
        lines.append(
            f"| {name} | {row['tweets_perplexity']:.1f} | {row['sms_perplexity']:.1f} | {drawn} | {row['seconds']:.0f} "
            f"| {row['steady_tokens_per_second'] or 0:.0f} | {row['load_at_start']} |"
        )
    lines += [
        "",
        f"- The mixture's SMS perplexity is {mix['sms_perplexity'] / sms['sms_perplexity']:.2f}x the SMS-alone run's "
        f"(the tweets-alone run's is {tweets['sms_perplexity'] / sms['sms_perplexity']:.2f}x), with "
        f"{mix['sms_share_tokens']:.0%} of its tokens from SMS; its tweets perplexity is "
        f"{mix['tweets_perplexity'] / tweets['tweets_perplexity']:.2f}x the tweets-alone run's (the SMS-alone run's is "
        f"{sms['tweets_perplexity'] / tweets['tweets_perplexity']:.2f}x).",
        f"- Passes over each source in the mixture: tweets {mix['tweets_epochs']:.2f}, SMS {mix['sms_epochs']:.2f}. "
        "Each run's figure on its own sources is its run's evaluation (the mixture's: metrics.json "
        "`sources.<name>.eval_perplexity`), the others `leantrain evaluate` on the other corpus's file (the two score "
        "alike: `tests/tasks/test_causal_lm.py`).",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", default=None, help="Working folder (default: a temporary one)")
    parser.add_argument("--out", default=str(RESULTS), help="Where the results pages go")
    args = parser.parse_args()

    from benchmarks._results import write_results
    from leantrain.commands.bench import environment_context

    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    work = Path(args.work or tempfile.mkdtemp(prefix="mixture-lm-"))
    work.mkdir(parents=True, exist_ok=True)
    texts = corpora()
    splits = write_splits(texts, work)
    model = shared_model(splits, work / "model")
    done = runs(args, splits, model, work)
    table = scores(done, splits)
    context = {
        "started": started,
        "load average before / after": f"{' '.join(f'{x:.2f}' for x in load_before)} / "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        **environment_context(),
    }
    sizes = {name: len(docs) for name, docs in texts.items()}
    text = write_results(Path(args.out), "mixture_lm", page(table, args, sizes), context, {"runs": table})
    print(text)


if __name__ == "__main__":
    main()
