"""LoRA and QLoRA (issue #15): only the adapters and the head train, resume is exact, model/ is the merged model,
bad input gets one line.

The tiny BERT with dropout on (adapters' dropout too), fp32 on CPU: a resumed run must equal the run left alone
bitwise. Checkpoints hold the whole peft model, frozen weights included, under peft's names
(`base_model.model.<name>`, adapters as `<layer>.lora_A.default.weight`, the head's trained copy as
`<head>.modules_to_save.default.<param>` beside its untouched `original_module`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.errors import ConfigError
from tests.hooks import Fault

PEFT_PREFIX = "base_model.model."
TEXTS = ["a wonderful film", "the story was really quite boring and tedious", "acting", "plot with superb acting"]


@pytest.fixture()
def job(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name="run", **changes) -> TrainConfig:
        base = dict(
            model=str(dropout_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            lora=True,
            lora_r=4,
            lora_dropout=0.1,
            batch_size=24,
            max_steps=8,
            lr=1e-2,
            precision="fp32",
            log_every=1,
            progress=False,
            report=False,
            seed=5,
        )
        return TrainConfig(**{**base, **changes})

    return make


def checkpoint_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(Path(run_dir) / "checkpoints" / f"step-{step:06d}" / "model.safetensors")


def model_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(run_dir) / "model" / "model.safetensors")


def base_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The pretrained encoder's weights under BertForSequenceClassification's names."""
    return {f"bert.{k}": v for k, v in load_file(Path(model_dir) / "model.safetensors").items()}


def loss_log(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_only_the_adapters_and_the_head_train(job, dropout_model_dir):
    result = train(job(save_every=8, save_adapter=True))
    saved = checkpoint_weights(result.output_dir, 8)  # the peft model as it trained, after the last step
    pretrained = base_weights(dropout_model_dir)
    adapters = {k for k in saved if ".lora_A." in k or ".lora_B." in k}
    head = {k for k in saved if k.startswith(PEFT_PREFIX + "classifier.")}
    frozen = {k: v for k, v in saved.items() if k not in adapters and k not in head}
    assert adapters and {k for k in head if ".modules_to_save." in k}
    # every frozen weight is the pretrained one, bitwise: embeddings, LayerNorms, every layer under an adapter
    names = {k.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): k for k in frozen}
    assert names.keys() == pretrained.keys() - {"bert.embeddings.position_ids"}
    changed = [n for n, k in names.items() if not torch.equal(frozen[k], pretrained[n])]
    assert not changed, f"{len(changed)} frozen tensors changed, e.g. {changed[0]}"
    # the adapters moved (B starts at zero) and so did the head's trained copy, away from its untouched original
    still = [k for k in adapters if ".lora_B." in k and not saved[k].abs().sum() > 0]
    assert not still, f"{len(still)} adapters never moved, e.g. {still[0]}"
    for p in ("weight", "bias"):
        original = saved[f"{PEFT_PREFIX}classifier.original_module.{p}"]
        assert not torch.equal(saved[f"{PEFT_PREFIX}classifier.modules_to_save.default.{p}"], original)
    # optimizer state only for what trains: AdamW's two moments per trainable element, nothing for frozen ones
    trainable = sum(v.numel() for k, v in saved.items() if k in adapters or ".modules_to_save." in k)
    assert result.metrics["optimizer_state_bytes"] == pytest.approx(8 * trainable, rel=0.01)
    assert result.metrics["gradients_bytes"] == 4 * trainable
    assert "frozen weights get no gradients" in result.metrics["flop_model"]  # MFU counts no frozen weight gradients


@pytest.mark.parametrize("pooler", ["auto", "identity"])  # identity: the pooler is not the base's, the adapter has it
def test_the_merged_model_gives_the_logits_of_the_adapter_on_the_base(job, dropout_model_dir, pooler):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    result = train(job(save_adapter=True, pooler=pooler))
    model_dir, adapter_dir = result.output_dir / "model", result.output_dir / "adapter"
    assert (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "adapter_model.safetensors").is_file()
    merged = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    assert not any("lora" in k for k in merged.state_dict())  # a plain transformers model
    base = AutoModelForSequenceClassification.from_pretrained(dropout_model_dir, num_labels=2)
    with_adapter = PeftModel.from_pretrained(base, adapter_dir).eval()
    inputs = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        a, b = merged(**inputs).logits, with_adapter(**inputs).logits
        with with_adapter.disable_adapter():  # the pretrained base with the head it started from
            untrained = with_adapter(**inputs).logits
    assert (a - b).abs().max().item() <= 1e-5
    assert (a - untrained).abs().max().item() > 1e-3  # training changed the model: the comparison means something
    labels = {row["label"] for row in pipeline("text-classification", model=str(model_dir))(TEXTS)}
    assert labels <= {"pos", "neg"}


def test_a_resumed_lora_run_equals_the_run_left_alone_bitwise(job):
    whole = train(job("whole", save_every=2, optimizer="adamw"))
    resumed = train(
        job("resumed", save_every=2, optimizer="adamw", resume=str(whole.output_dir / "checkpoints" / "step-000004"))
    )
    assert resumed.metrics["train_examples"] == 4 * 24  # only the steps after the checkpoint trained
    a, b = model_weights(whole.output_dir), model_weights(resumed.output_dir)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)


def test_a_lora_run_that_crashed_and_resumed_equals_the_run_left_alone(job):
    whole = train(job("whole", save_every=3))
    crashed = job("crashed", save_every=3)
    with pytest.raises(RuntimeError, match="injected fault"):
        train(crashed, hooks=Fault(rank=0, step=5, mode="raise"))  # after the step-3 checkpoint
    resumed = train(crashed.replace(resume="auto"))
    assert resumed.metrics["resumed_from"].endswith("step-000003")
    a, b = model_weights(whole.output_dir), model_weights(resumed.output_dir)
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)


# -- bad input ---------------------------------------------------------------------------------------------------


def test_lora_targets_may_be_a_list_of_module_names_in_python(job):
    """peft's target_modules is a list, and --lora-targets a,b names two: train() takes either; a list holding
    anything but names is refused in one line."""
    result = train(job(max_steps=1, save_adapter=True), lora_targets=("query", "value"))
    adapter = json.loads((Path(result.output_dir) / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["query", "value"]
    assert TrainConfig(lora_targets=["query", "value"]).lora_targets == "query,value"
    for bad in ([3], {"query"}, 3):
        with pytest.raises(ConfigError, match=r"^--lora-targets must be a string or a list of strings, got "):
            train(job(), lora_targets=bad)


@pytest.fixture()
def argv(tiny_model_dir, sentiment_csv, tmp_path, cache_dir):
    return [
        "train",
        *("--model", str(tiny_model_dir), "--data", str(sentiment_csv)),
        *("--output-dir", str(tmp_path / "run"), "--cache-dir", str(cache_dir)),
        *("--no-progress", "--precision", "fp32", "--max-steps", "1", "--lora"),
    ]


def one_line_error(capsys, args: list[str]) -> str:
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if "error:" in line or "Traceback" in line]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_lora_targets_naming_no_module_is_refused_naming_valid_ones(capsys, argv):
    line = one_line_error(capsys, [*argv, "--lora-targets", "query,q_proj"])
    assert "--lora-targets" in line and "q_proj" in line and "query" in line.split("such as")[1]


@pytest.mark.parametrize(
    ("targets", "needle"),
    [
        ("LayerNorm", "LayerNorm (LayerNorm) takes no adapter"),  # a layer peft cannot adapt
        ("attention", "attention (BertAttention) takes no adapter"),  # a block, not a layer
        ("classifier", "outside its head (classifier, which trains whole)"),  # the head trains whole already
    ],
)
def test_lora_targets_naming_a_module_that_takes_no_adapter_is_refused_in_one_line(capsys, argv, targets, needle):
    """Each was peft's traceback (ValueError, NoMatchingPeftModuleError) after the model had loaded."""
    line = one_line_error(capsys, [*argv, "--lora-targets", targets])
    assert needle in line and "query" in line.split("such as")[1], line


@pytest.mark.slow  # launches a `leantrain train` process (peft and bitsandbytes imported afresh): 9-15 s, load 2-4
def test_bitsandbytes_is_imported_with_its_hub_kernel_lookup_quiet(argv):
    """On a CPU with AVX512-BF16, importing bitsandbytes (peft does) looks for a 4-bit kernel on the Hub and, offline,
    logs two warnings a user can do nothing about. Whatever this CPU, the loggers must be quiet by the time the
    import happens: a fresh process records their state at the moment bitsandbytes is first imported."""
    import subprocess

    probe = (
        "import importlib.abc, logging, sys\n"
        "seen = []\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'bitsandbytes':\n"
        "            seen.append([logging.getLogger(n).isEnabledFor(logging.WARNING)\n"
        "                         for n in ('kernels', 'bitsandbytes.backends.cpu.ops')])\n"
        "sys.meta_path.insert(0, Watch())\n"
        "from leantrain.commands.cli import main\n"
        f"code = main({argv!r})\n"
        "print('SEEN', seen[:1], code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert "SEEN [[False, False]] 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_lora_rank_0_is_refused(capsys, argv):
    line = one_line_error(capsys, [*argv, "--lora-r", "0"])
    assert "--lora-r" in line and "positive" in line
    with pytest.raises(ConfigError, match="--quantize needs --lora"):
        TrainConfig(quantize="4bit")


def test_quantize_without_bitsandbytes_is_refused_naming_the_device(capsys, argv, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what an absent package looks like to `import`
    line = one_line_error(capsys, [*argv, "--quantize", "4bit"])
    assert "--quantize 4bit" in line and "cpu" in line and "pip install bitsandbytes" in line


def test_quantize_where_bitsandbytes_cannot_run_is_refused_naming_the_device(capsys, argv, monkeypatch):
    from leantrain.model import lora

    def cannot(*args, **kwargs):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(lora, "_quantized_linear", cannot)
    line = one_line_error(capsys, [*argv, "--quantize", "8bit"])
    assert "--quantize 8bit" in line and "cannot run 8bit layers on cpu" in line and "no kernel" in line


# -- several processes -------------------------------------------------------------------------------------------


@pytest.mark.slow  # launches a 2-process torchrun job
def test_two_processes_train_the_adapters_as_one_process_does(tiny_model_dir, tmp_path):
    """Global batch 16 (2 processes x 8, against 1 x 16), plain SGD in fp32, adapters' dropout off: the merged
    models agree to float rounding, the frozen weights bitwise."""
    from tests.conftest import EXACT_JOB, make_sentiment_rows, max_diff, write_csv
    from tests.parallel.test_data_parallel import flags, run_job

    train_csv = write_csv(tmp_path / "train.csv", make_sentiment_rows(109, seed=11))
    base = dict(
        model=str(tiny_model_dir),
        data=str(train_csv),
        cache_dir=str(tmp_path / "cache"),
        **EXACT_JOB,
        lora=True,
        lora_r=4,
        lora_dropout=0.0,
        epochs=1,
        report=False,
    )
    one = train(TrainConfig(**base, batch_size=16, output_dir=str(tmp_path / "one")))
    two = tmp_path / "two"
    args = flags(**base, batch_size=8, output_dir=two, num_processes=2, launcher="torchrun")
    rc, _, err = run_job(["-m", "leantrain", "train", *args])
    assert rc == 0, err[-3000:]
    metrics = json.loads((two / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and metrics["optimizer_steps"] == one.metrics["optimizer_steps"] == 7
    a, b = model_weights(one.output_dir), model_weights(two)
    assert max_diff(a, b) <= 1e-5
    pretrained = base_weights(tiny_model_dir)
    moved = [k for k in a if k in pretrained and not torch.equal(a[k], pretrained[k])]
    assert moved and all(k.endswith(("query.weight", "key.weight", "value.weight", "dense.weight")) for k in moved)


# -- a quantized base (QLoRA) ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_qlora_resumes_exactly_and_publishes_the_adapter_merged_into_the_dequantized_base(job, bits, dropout_model_dir):
    """4-bit: the quantized layer dequantizes its weight and multiplies in fp32, so the merged model gives its
    logits to rounding. 8-bit: LLM.int8 also quantizes each input row to int8 (after a cast to fp16), which the
    merged fp32 model does not: measured 2e-4 on logits of about 0.1 here (docs/lora.md has MiniLM's figures)."""
    pytest.importorskip("bitsandbytes")
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from leantrain.model import lora

    whole = train(job("whole", quantize=bits, save_every=2, max_steps=4, save_adapter=True))
    ckpt = whole.output_dir / "checkpoints" / "step-000002"
    resumed = train(job("resumed", quantize=bits, save_every=2, max_steps=4, resume=str(ckpt)))
    assert resumed.metrics["train_examples"] == 2 * 24
    assert "estimated for frozen weights" in whole.metrics["flop_model"]  # quantized weights cannot go on meta
    a, b = model_weights(whole.output_dir), model_weights(resumed.output_dir)
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    # the frozen quantized weights never moved: the last checkpoint's equal the first's
    first, last = checkpoint_weights(whole.output_dir, 2), checkpoint_weights(whole.output_dir, 4)
    quantized = [k for k in first if k.endswith("base_layer.weight")]
    assert quantized and all(first[k].dtype in (torch.uint8, torch.int8) for k in quantized)
    assert all(torch.equal(first[k], last[k]) for k in quantized)
    merged = AutoModelForSequenceClassification.from_pretrained(whole.model_dir).eval()
    assert all(
        type(m).__module__.startswith("torch") or "bitsandbytes" not in type(m).__module__ for m in merged.modules()
    )
    base = AutoModelForSequenceClassification.from_pretrained(dropout_model_dir, num_labels=2)
    lora.quantize_base(base, bits, lora.head_modules(base), torch.device("cpu"))
    on_quantized = PeftModel.from_pretrained(base, whole.output_dir / "adapter").eval()
    inputs = AutoTokenizer.from_pretrained(whole.model_dir)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        diff = (merged(**inputs).logits - on_quantized(**inputs).logits).abs().max().item()
    assert diff <= (1e-5 if bits == "4bit" else 2e-3), diff


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_a_base_to_quantize_loads_as_stored_and_what_trains_is_fp32(tiny_model_dir, tmp_path, bits, job, monkeypatch):
    """A bf16 checkpoint (most causal LMs on the Hub) is quantized from its bf16 weights, so loading it costs its bf16
    size, not the fp32 copy every other run loads; what stays unquantized (embeddings, norms, the head, the
    adapters) is fp32, as without --quantize."""
    pytest.importorskip("bitsandbytes")
    from types import SimpleNamespace

    from transformers import AutoModel, AutoTokenizer

    from leantrain.model import loading, lora

    folder = tmp_path / "bf16"
    AutoModel.from_pretrained(tiny_model_dir).to(torch.bfloat16).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    with loading.weights_as_stored():
        model = loading.load_for_classification(str(folder), ["neg", "pos"])
    assert next(model.bert.parameters()).dtype == torch.bfloat16
    assert next(loading.load_for_classification(str(folder), ["neg", "pos"]).bert.parameters()).dtype == torch.float32
    cfg = SimpleNamespace(lora_r=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="auto", quantize=bits)
    model = lora.apply(model, cfg, torch.device("cpu"))
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.is_floating_point()} == {
        torch.uint8 if bits == "4bit" else torch.int8
    }
    # a run does the same: its base reaches the quantizer in bf16, and it trains
    quantized = []
    quantize_base = lora.quantize_base
    monkeypatch.setattr(lora, "quantize_base", lambda m, *a: quantized.append(m.dtype) or quantize_base(m, *a))
    train(job(model=str(folder), quantize=bits, max_steps=2))
    assert quantized == [torch.bfloat16]


# -- the planner -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantize", "precision"), [(None, "fp32"), ("4bit", "fp32"), (None, "bf16"), ("4bit", "bf16")]
)
def test_the_planner_counts_what_a_lora_model_holds(tiny_model_dir, quantize, precision):
    """Trainable shapes, frozen (quantized) weight bytes and AdamW's state after a step, as the real peft model
    has them; full fine-tuning's gradients and optimizer state are what LoRA leaves out. In bf16 the frozen
    weights are kept in bf16 (`freezing.store_frozen`)."""
    import contextlib
    from types import SimpleNamespace

    from transformers import AutoModelForSequenceClassification

    from leantrain.model import freezing, lora
    from leantrain.model.optimizers import build_optimizer, state_bytes
    from leantrain.planner import memory as M

    if quantize:
        pytest.importorskip("bitsandbytes")
    facts = M.model_facts(str(tiny_model_dir))
    spec = M.LoraSpec(r=4, quantize=quantize)
    cfg = SimpleNamespace(lora_r=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="auto", quantize=quantize)
    model = lora.apply(
        AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2), cfg, torch.device("cpu")
    )
    low = precision == "bf16"
    if low:
        assert freezing.store_frozen(model, torch.bfloat16) is not None
    optimizer = build_optimizer(model, "adamw", 1e-3, 0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16) if low else contextlib.nullcontext():
        model(input_ids=torch.tensor([[101, 2307, 102]]), labels=torch.tensor([1])).loss.backward()
    optimizer.step()
    predicted = M.estimate(facts, 4, 16, precision, False, "adamw", lora=spec)
    full = M.estimate(facts, 4, 16, precision, False, "adamw")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert predicted.gradients == 4 * sum(p.numel() for p in trainable) < full.gradients / 20
    assert predicted.optimizer_state == state_bytes(optimizer) < full.optimizer_state / 20
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    assert predicted.weights == pytest.approx(
        stored + sum(b.numel() * b.element_size() for b in model.buffers()), rel=0.01
    )


def test_the_planner_counts_a_pooler_started_as_the_identity_as_training_whole(tiny_model_dir):
    """--pooler identity (auto on a sentence-transformers checkpoint, the embedded MiniLM): the pooler trains whole
    with the head under LoRA, and the planner's gradients and optimizer state count it so."""
    from types import SimpleNamespace

    from transformers import AutoModelForSequenceClassification

    from leantrain.model import loading, lora
    from leantrain.planner import memory as M

    cfg = SimpleNamespace(lora=True, lora_r=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="auto", quantize=None)
    spec = M.LoraSpec.of(SimpleNamespace(**vars(cfg), pooler="identity", model=str(tiny_model_dir)))
    assert spec is not None and spec.pooler_whole
    assert not M.LoraSpec.of(SimpleNamespace(**vars(cfg), pooler="auto", model=str(tiny_model_dir))).pooler_whole
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    loading.start_pooler(model, str(tiny_model_dir), "identity")
    model = lora.apply(model, cfg, torch.device("cpu"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    facts = M.model_facts(str(tiny_model_dir))
    assert M.estimate(facts, 4, 16, "fp32", False, "adamw", lora=spec).gradients == 4 * trainable
    assert M.estimate(facts, 4, 16, "fp32", False, "adamw", lora=M.LoraSpec(r=4)).gradients < 4 * trainable


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_qlora_trains_a_causal_lm_whose_output_layer_stays_unquantized(tmp_path, bits):
    """A causal LM's output layer is no head LoRA trains whole, yet not quantized either, as transformers leaves it:
    quantized, the fused head loss multiplied by its packed weight (a shape error at the first step). The planner
    counts its weight as stored in full."""
    pytest.importorskip("bitsandbytes")
    from leantrain.model import lora
    from leantrain.planner import memory as M
    from tests.test_attention import llama_run

    run = llama_run(tmp_path, lora=True, lora_r=4, quantize=bits, max_steps=2)
    assert run.metrics["optimizer_steps"] == 2 and math.isfinite(run.metrics["train_loss"])
    facts = M.model_facts(str(tmp_path / "llama"))
    net = M._build(M._config_from_json(facts.config_json), "meta")
    names = lora.quantized_names(net, lora.head_modules(net))
    assert "lm_head" not in names and any(n.endswith("q_proj") for n in names)


@pytest.fixture()
def bf16_model_dir(dropout_model_dir, tmp_path):
    """The dropout BERT stored in bf16, as most causal LMs on the Hub are."""
    from transformers import AutoModel, AutoTokenizer

    path = tmp_path / "bf16-model"
    AutoModel.from_pretrained(dropout_model_dir, dtype=torch.float32).to(torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(dropout_model_dir).save_pretrained(path)
    return path


@pytest.mark.parametrize(("stored", "precision"), [("fp32", "bf16"), ("bf16", "bf16"), ("fp32", "fp16")])
def test_a_bf16_run_keeps_frozen_weights_in_bf16_and_trains_the_same_bits(
    job, monkeypatch, dropout_model_dir, bf16_model_dir, stored, precision
):
    """Autocast casts a frozen fp32 weight afresh in every forward: stored in the run's precision it is the same bits
    for the matmul, in half the memory and without the copy autograd keeps; an embedding table too where bf16 holds
    its values (a checkpoint stored in bf16), its lookups cast back to fp32. model/ comes out fp32, and the planner
    counts what the run holds. fp16 on a CPU alike: leantrain autocasts its training and evaluation itself."""
    from leantrain.model import freezing
    from leantrain.planner import memory as M

    model_dir = dropout_model_dir if stored == "fp32" else bf16_model_dir
    low = train(job("low", model=str(model_dir), precision=precision, save_every=8))
    monkeypatch.setattr(freezing, "store_frozen", lambda model, dtype: None)  # every weight fp32, as before
    fp32 = train(job("fp32", model=str(model_dir), precision=precision, save_every=8))
    assert loss_log(low.output_dir) == loss_log(fp32.output_dir)
    a, b = checkpoint_weights(low.output_dir, 8), checkpoint_weights(fp32.output_dir, 8)
    trained = [k for k in a if ".lora_" in k or ".modules_to_save." in k]
    assert trained and all(torch.equal(a[k], b[k]) for k in trained)
    assert low.metrics["eval_loss"] == fp32.metrics["eval_loss"]  # evaluation in the run's autocast, both
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    kept = {k for k, v in a.items() if v.dtype == dtype}
    # every frozen Linear under an adapter and the head's untouched original, the tables when bf16 holds them
    tables = {k for k in a if k.endswith("embeddings.weight")} if stored == "bf16" else set()
    assert kept == {k for k in a if k.rpartition(".")[0].endswith((".base_layer", ".original_module"))} | tables
    assert all(b[k].dtype == torch.float32 and torch.equal(b[k].to(dtype), a[k]) for k in kept)
    assert sum(a[k].nbytes for k in kept) * 2 == sum(b[k].nbytes for k in kept)
    lora_spec = M.LoraSpec(r=4, dropout=0.1, pooler_whole=False)
    planned = M.estimate(M.model_facts(str(model_dir)), 4, 16, precision, False, "adamw", lora=lora_spec).weights
    assert planned == pytest.approx(low.metrics["weights_bytes"], rel=0.01)
    merged, merged_fp32 = model_weights(low.output_dir), model_weights(fp32.output_dir)
    assert {v.dtype for v in merged.values() if v.is_floating_point()} == {torch.float32}
    # the same update merged in fp32 into the base the run computed with (rounded to bf16), none of it rounded away
    pretrained = base_weights(model_dir)
    for key in (k for k in merged if k.endswith("attention.self.query.weight")):
        update = merged_fp32[key] - pretrained[key].float()
        assert update.abs().max() > 0
        torch.testing.assert_close(merged[key] - pretrained[key].to(dtype).float(), update, rtol=0, atol=1e-6)
