"""Shared fixtures: a tiny random BERT (with MiniLM's real tokenizer) and small labelled files.

Tests never reach the Hub: HF_HUB_OFFLINE is set before transformers is imported, and every model
comes from a local folder or a config.
"""

from __future__ import annotations

import atexit
import csv
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# --- the suite writes nothing into the real home folder (issue #20, item 11) ---
# leantrain's cache (peak.json, tokenized data) defaults to ~/.cache/leantrain, and Hugging Face's,
# matplotlib's and others' caches live under ~ too: for this session HOME is a temporary folder and
# leantrain's cache another, set before anything is imported (subprocesses inherit both).
# tests/test_home_cache.py checks that train and evaluate land there.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="leantrain-tests-"))
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
# The measured peak FLOP/s are kept: copied in (read, never written back), so a machine without fast bf16/fp16
# does not re-run its minutes-long low-precision GEMM probes (telemetry/peak.py) in every session.
_user_peaks = Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain") / "peak.json"
(SESSION_DIR / "home").mkdir()
(SESSION_DIR / "leantrain-cache").mkdir()
if _user_peaks.is_file():
    shutil.copy(_user_peaks, SESSION_DIR / "leantrain-cache" / "peak.json")
os.environ["HOME"] = str(SESSION_DIR / "home")
os.environ["LEANTRAIN_CACHE"] = str(SESSION_DIR / "leantrain-cache")
os.environ.pop("XDG_CACHE_HOME", None)
os.environ.pop("HF_HOME", None)

# --- the fast tier, `-m "not slow"` (issue #20, item 12) ---
# Tests that launch processes (torchrun, Ray, SIGKILL'd runs) or run for more than about 15 s are marked
# `@pytest.mark.slow` in their own files, with their measured time (CONTRIBUTING.md).
# --- end of issue #20 items 11, 12 ---

# --- parallel workers (pytest-xdist, `-n N` in scripts/test.sh) share the cores ---
# Each worker gets its share of the CPUs as OpenMP threads, as a launcher gives its ranks, so that N workers do
# not run N x cores spinning threads (the busy-machine collapse of issue #16). Set before torch is imported;
# processes the tests launch inherit it, and a setting of the user's stands.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cpus // _workers))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

POSITIVE = ["great", "wonderful", "superb", "lovely", "excellent", "delightful", "brilliant", "charming"]
NEGATIVE = ["awful", "terrible", "dreadful", "boring", "horrible", "poor", "tedious", "clumsy"]
FILLER = ["the", "film", "was", "a", "story", "with", "acting", "and", "plot", "really", "quite", "very"]


#: settings under which two runs that should train identically can be compared to 1e-5: plain SGD in
#: fp32 (Adam magnifies rounding near zero gradients), no weight decay, warm-up or clipping, fixed seed
EXACT_JOB = dict(
    optimizer="sgd",
    lr=0.5,
    precision="fp32",
    weight_decay=0.0,
    warmup_ratio=0.0,
    max_grad_norm=0.0,
    progress=False,
    log_every=1,
    seed=3,
)


def max_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def make_sentiment_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Short texts whose label is carried by one sentiment word: learnable by a tiny model in seconds."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        words = rng.choices(FILLER, k=rng.randint(2, 14))
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label == "pos" else NEGATIVE))
        rows.append((" ".join(words), label))
    rng.shuffle(rows)
    return rows


def write_csv(path: Path, rows, header=("text", "label"), delimiter=",") -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from leantrain.model.loading import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, 64-wide BERT with random weights and MiniLM's tokenizer; dropout off for exact tests."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    import torch

    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def dropout_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny BERT with dropout on (0.1), as models ship: exactness then also covers the RNG."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("tiny-bert-dropout")
    for f in tiny_model_dir.iterdir():
        shutil.copy(f, path / f.name)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def sentiment_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("data") / "sentiment.csv", make_sentiment_rows(240))


@pytest.fixture()
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


#: tensors whose gradient is zero in exact arithmetic (softmax ignores a constant added to every key), so
#: they move only by rounding: compared in absolute terms and not required to move
ZERO_GRADIENT = ("attention.self.key.bias",)


def assert_trained_alike(a: dict, b: dict, start: dict, rel: float = 1e-4) -> None:
    """Two runs' weights agree per tensor, relative to how far each tensor moved from `start`, and every
    tensor moved. A single absolute maximum would miss a tensor that moves ~1e-7 per step and is wrong.

    Each tensor may differ by `rel` of its own movement plus a few float32 rounding steps (ulps) of its
    magnitude: summing the same gradients in another order rounds differently, nothing more.
    """
    import torch

    assert a.keys() == b.keys() == start.keys()
    eps = torch.finfo(torch.float32).eps
    wrong, still = [], []
    for k in a:
        x, y, s = a[k].double(), b[k].double(), start[k].double()
        moved = (x - s).abs().max().item()
        ulps = 8 * eps * x.abs().max().item()
        if moved <= ulps and not k.endswith(ZERO_GRADIENT):
            still.append(k)
        diff = (x - y).abs().max().item()
        if k.endswith(ZERO_GRADIENT):
            ulps = max(ulps, 1e-9)  # rounding noise from a start at zero: far below any real update
        if diff > rel * moved + ulps:
            wrong.append(f"{k}: differs by {diff:.3g} after moving {moved:.3g}")
    assert not still, f"{len(still)} tensors never moved, e.g. {still[0]}"
    assert not wrong, f"{len(wrong)} of {len(a)} tensors differ: " + "; ".join(wrong[:3])
