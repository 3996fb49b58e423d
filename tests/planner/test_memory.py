"""The memory model: units, optimizer state against real optimizers, and predicted against measured peaks.

The measured peaks come from benchmarks/planner_measure.py (the trainer's step, in a fresh
interpreter, the resident high-water mark over a baseline taken before the model is built, after a
warm-up so the one-off runtime share is left out on both sides).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from benchmarks.planner_measure import Trial, measure_trials

from leantrain.config.units import parse_memory
from leantrain.errors import ConfigError
from leantrain.model.optimizers import OPTIMIZERS
from leantrain.planner import memory as M

TOLERANCE = 0.15


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8GiB", 8 * 2**30), ("512MiB", 512 * 2**20), ("8GB", 8 * 10**9), ("1.5 GiB", int(1.5 * 2**30)), ("1024", 1024)],
)
def test_memory_units(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["8 gigs", "GiB", "-1GiB", "0MiB", ""])
def test_bad_memory_values_fail_in_one_line(bad):
    with pytest.raises(ConfigError, match="--memory") as info:
        parse_memory(bad)
    assert "\n" not in str(info.value)


def test_config_checks_memory():
    from leantrain import TrainConfig

    assert TrainConfig(memory="2GiB", auto=True).memory == "2GiB"
    with pytest.raises(ConfigError, match="8GiB"):
        TrainConfig(memory="eight")


@pytest.mark.parametrize(
    "optimizer, embeddings",
    [(name, False) for name in OPTIMIZERS] + [("galore-adamw", True), ("apollo-adamw", True)],
)
def test_optimizer_state_matches_real_optimizers(tiny_model_dir, optimizer, embeddings):
    """The planner's count of each optimizer's state (from the model's config, on the meta device, its hidden
    matrices picked there, and with --projection-embeddings the input embeddings) is what the real optimizer holds
    after a step, byte for byte (rank 8 of the tiny BERT's 64-wide matrices; the default rank 128 is larger than
    them)."""
    from types import SimpleNamespace

    from benchmarks.planner_measure import build_model

    from leantrain.model.optimizers import build_optimizer, state_bytes, use_weights

    if optimizer == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    settings = SimpleNamespace(projection_rank=8, projection_embeddings=embeddings)
    model = build_model(str(tiny_model_dir))
    opt = build_optimizer(model, optimizer, lr=1e-3, weight_decay=0.01, settings=settings)
    use_weights(optimizer, opt, "train")
    for _ in range(2):  # (APOLLO's limiter keeps its last norm from the first step on)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    facts = M.model_facts(str(tiny_model_dir))
    assert facts.params == sum(p.numel() for p in model.parameters())
    assert facts.inventory.state_bytes(optimizer, settings) == state_bytes(opt)


@pytest.mark.parametrize("optimizer", ["muon", "galore-adamw", "apollo-adamw"])
def test_hidden_matrix_state_of_a_causal_lm_with_tied_embeddings_matches(optimizer):
    """A Llama whose embedding is its output layer: the planner, on the meta device, picks the same hidden matrices
    as the builder (the tied tensor counted once, under AdamW)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from leantrain.model.optimizers import build_optimizer, state_bytes

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         architectures=["LlamaForCausalLM"])  # fmt: skip
    model = LlamaForCausalLM(config)
    settings = SimpleNamespace(projection_rank=4)
    opt = build_optimizer(model, optimizer, lr=1e-3, settings=settings)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    facts = M.model_facts("tiny-llama", config=config)
    assert facts.kind == "causal-lm" and sum(facts.inventory.hidden) == 2 * 7  # q k v o gate up down, 2 layers
    assert facts.inventory.state_bytes(optimizer, settings) == state_bytes(opt)


def test_activation_profile_separates_layers_batch_and_copies(tiny_model_dir):
    facts = M.model_facts(str(tiny_model_dir))
    fp32 = M.activation_profile(facts.config_json, 64, "fp32", False)
    bf16 = M.activation_profile(facts.config_json, 64, "bf16", False)
    ckpt = M.activation_profile(facts.config_json, 64, "fp32", True)
    assert fp32.per_layer > 0 and fp32.copies_per_layer == 0  # fp32 keeps no weight copies
    assert bf16.per_layer < fp32.per_layer  # bf16 activations are (mostly) half the size
    assert bf16.copies_per_layer > 0  # autocast's bf16 copies of the weights
    # checkpointing keeps only each layer's input (hidden x 4 bytes per token), and recomputes one layer at a time
    assert ckpt.per_layer == pytest.approx(64 * facts.hidden * 4, rel=0.05)
    assert ckpt.layer_full == pytest.approx(fp32.per_layer, rel=1e-6)
    # twice the length: more than twice the bytes per sequence would mean a quadratic term; BERT's SDPA has none
    longer = M.activation_profile(facts.config_json, 128, "fp32", False)
    assert longer.per_layer == pytest.approx(2 * fp32.per_layer, rel=0.05)


def saved_bytes(model, step) -> int:
    """Bytes of the distinct storages autograd saves while `step()` runs (the model's parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


def test_a_classifiers_activations_are_planned_as_its_task_runs_it(tiny_model_dir):
    """The activations planned for a classifier are what the task's forward saves, its last layer after attention
    at the first token only: in this two-layer model a fifth less than the whole model saves."""
    from leantrain import TrainConfig
    from leantrain.model import loading
    from leantrain.tasks.text_classification import TextClassification

    facts = M.model_facts(str(tiny_model_dir))
    planned = M.activation_profile(facts.config_json, 32, "fp32", False).saved(4, facts.layers, False)
    model = loading.load_for_classification(str(tiny_model_dir), ["neg", "pos"])
    model.train()
    task = TextClassification(TrainConfig(model=str(tiny_model_dir), data="unused.csv"))
    task.check_model(model)
    ids = torch.randint(1000, 30000, (4, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1, 0])}
    ours = saved_bytes(model, lambda: task.loss_sum(task.forward(model, batch), batch))
    whole = saved_bytes(model, lambda: task.loss_sum(model(**task.model_inputs(batch)), batch))
    assert planned == pytest.approx(ours, rel=0.03)
    assert ours < 0.85 * whole


def test_a_bf16_lora_classifiers_activations_are_planned_with_its_frozen_weights_kept_in_bf16(tiny_model_dir):
    """Under LoRA in bf16 the frozen weights are kept in bf16 (`freezing.store_frozen`), so autograd keeps no bf16
    copy of them: planned as the real peft model saves, and less than with fp32 frozen weights."""
    from types import SimpleNamespace

    from leantrain import TrainConfig
    from leantrain.model import freezing, loading, lora
    from leantrain.tasks.text_classification import TextClassification

    facts = M.model_facts(str(tiny_model_dir))
    spec = M.LoraSpec(r=4)
    planned = M.activation_profile(facts.config_json, 32, "bf16", False, lora=spec).saved(4, facts.layers, False)
    cfg = SimpleNamespace(lora_r=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="auto", quantize=None)
    model = loading.load_for_classification(str(tiny_model_dir), ["neg", "pos"])
    model.train()
    task = TextClassification(TrainConfig(model=str(tiny_model_dir), data="unused.csv"))
    task.check_model(model)
    model = lora.apply(model, cfg, torch.device("cpu"))
    ids = torch.randint(1000, 30000, (4, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1, 0])}

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            task.loss_sum(task.forward(model, batch), batch)

    with_copies = saved_bytes(model, step)
    freezing.store_frozen(model, torch.bfloat16)
    ours = saved_bytes(model, step)
    assert planned == pytest.approx(ours, rel=0.05)
    assert ours < 0.8 * with_copies


@pytest.mark.parametrize(
    ("freeze", "leading"),
    [("bert.embeddings.*,bert.encoder.layer.0.*", 1), ("embeddings,bert.encoder.layer.0.*", 0), ("embeddings", 0)],
)
def test_layers_frozen_with_everything_before_them_are_planned_without_activations(tiny_model_dir, freeze, leading):
    """With the embeddings and the first layer frozen, nothing in that layer needs a gradient: it saves nothing, and
    the plan counts one layer fewer (it counted every layer). Still an overestimate, by what the frozen embeddings
    no longer save (part of the planned base) and, where a frozen layer follows a trained part (the word table
    frozen, the position embeddings training), by the inputs its frozen Linear layers no longer save."""
    from leantrain import TrainConfig
    from leantrain.model import freezing, loading
    from leantrain.tasks.text_classification import TextClassification

    facts = M.model_facts(str(tiny_model_dir))
    assert M.frozen_leading_layers(facts.config_json, freeze) == leading
    b = 16  # a batch whose peak is in backward (at 4 the gradients outweigh the activations: the end of backward)
    planned = M.estimate(facts, b, 32, "fp32", False, "adamw", freeze=freeze).activations
    model = loading.load_for_classification(str(tiny_model_dir), ["neg", "pos"])
    model.train()
    freezing.apply(model, freeze)
    task = TextClassification(TrainConfig(model=str(tiny_model_dir), data="unused.csv"))
    task.check_model(model)
    ids = torch.randint(1000, 30000, (b, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1] * (b // 2))}
    measured = saved_bytes(model, lambda: task.loss_sum(task.forward(model, batch), batch))
    per_layer = M.activation_profile(facts.config_json, 32, "fp32", False).per_layer
    whole = M.estimate(facts, b, 32, "fp32", False, "adamw").activations
    assert planned == pytest.approx(whole - leading * b * per_layer, abs=1)
    assert measured <= planned <= 1.3 * measured


def _table(rows) -> str:
    lines = ["| precision | ckpt | optimizer | batch x accum | length | predicted MiB | measured MiB | error |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for r, predicted, error in rows:
        lines.append(
            f"| {r['precision']} | {r['activation_checkpointing']} | {r['optimizer']} | {r['batch_size']} x "
            f"{r['grad_accum']} | {r['seq_len']} | {predicted / 2**20:.1f} | {r['measured_peak_bytes'] / 2**20:.1f} "
            f"| {error:+.1%} |"
        )
    return "\n".join(lines)


def memory_is_short() -> bool:
    """Whether this machine has under 2 GiB available: the kernel may then reclaim pages mid-measurement."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 < 2 * 2**30
    return False


def check_against_measurement(model: str | None, trials: list[Trial], tolerance: float = TOLERANCE) -> None:
    """Predicted against measured peaks, each within `tolerance`. The machine is shared: a trial off by more is
    measured once more, in a new interpreter, and fails only if both measurements are off (a neighbour can
    disturb one measurement, not the model). Too little free memory skips instead of measuring noise."""
    if memory_is_short():
        pytest.skip("under 2 GiB of memory available: a measured peak would not be reliable now")
    facts = M.model_facts(model)

    def compare(measured: list[dict]) -> list[tuple[dict, int, float]]:
        rows = []
        for r in measured:
            e = M.estimate(
                facts,
                r["batch_size"],
                r["seq_len"],
                r["precision"],
                r["activation_checkpointing"],
                r["optimizer"],
                r["grad_accum"],
                counted=r.get("counted", 1.0),
                target_len=r.get("target_len", 0),
                freeze=r.get("freeze"),
            )
            assert r["optimizer_state_bytes"] == e.optimizer_state  # exact, as above
            rows.append((r, e.steady_peak, e.steady_peak / r["measured_peak_bytes"] - 1))
        return rows

    rows = compare(measure_trials(trials))
    off = [i for i, row in enumerate(rows) if abs(row[2]) > tolerance]
    if off:
        print("re-measuring:\n" + _table([rows[i] for i in off]))
        again = compare(measure_trials([trials[i] for i in off]))
        for i, row in zip(off, again):
            rows[i] = min(rows[i], row, key=lambda r: abs(r[2]))
    table = _table(rows)
    print(table)
    bad = [row for row in rows if abs(row[2]) > tolerance]
    assert not bad, f"predicted peak off by more than {tolerance:.0%} in two measurements:\n{table}"


@pytest.mark.slow  # measures in a new Python process
def test_tiny_bert_predicted_peak_within_15_percent_of_measured(tiny_model_dir):
    """Several batch sizes and lengths, with and without checkpointing, AdamW/Adafactor/8-bit AdamW, fp32/bf16."""
    m = str(tiny_model_dir)
    check_against_measurement(  # three shapes (each warmed up once per precision and optimizer) keep it quick
        m,
        [
            Trial(m, "fp32", False, "adamw", 64, 1, 128, steps=2),
            Trial(m, "fp32", True, "adamw", 128, 1, 64, steps=2),
            Trial(m, "fp32", False, "adafactor", 128, 1, 64, steps=2),
            Trial(m, "fp32", True, "adamw8bit", 64, 1, 128, steps=2),
            Trial(m, "bf16", False, "adamw", 64, 1, 128, steps=2),
            Trial(m, "fp32", False, "adamw", 32, 2, 128, steps=2),
        ],
    )


@pytest.mark.slow  # measures in a new Python process: 2 trials, one shape warmed up (40 s at load 4)
def test_freezing_the_lower_half_is_planned_within_15_percent_of_measured(tiny_model_dir):
    """The tiny BERT at 64 x 128 tokens (activations most of its peak) trained whole and with its embeddings and
    first layer frozen (--freeze), whose layer then saves nothing for backward: measured 7.8% and 4.9% under
    (2026-12-06). Counted as if it trained, the frozen layer put the second trial 86% over."""
    m = str(tiny_model_dir)
    lower = "bert.embeddings.*,bert.encoder.layer.0.*"
    assert M.frozen_leading_layers(M.model_facts(m).config_json, lower) == 1
    check_against_measurement(
        m, [Trial(m, "fp32", False, "adamw", 64, 1, 128, steps=2, freeze=f) for f in (None, lower)]
    )


@pytest.mark.slow  # 3 trials, each warmed up: 170 s at load 3 (4 larger trials: 374 s in CI at load 1-3)
def test_minilm_predicted_peak_within_15_percent_of_measured():
    """MiniLM's real shapes (12 heads, 384 wide, 6 layers) through each term of the model: every activation kept
    (fp32, AdamW: activations are two thirds of the peak), checkpointed layers (fp32, Adafactor) and bf16 with
    checkpointing and 8-bit AdamW, both predicted to peak in the optimizer step. Tried: checkpointing ignored by
    the activation count puts the second trial 38% over; no optimizer workspace puts the checkpointed trials 35%
    and 51% under. Small shapes, because bf16 is emulated on CPUs without native bf16 (25 s a step at 8 x 64 on
    the CI machine); larger shapes and the other combinations are in benchmarks/results/planner_accuracy.md
    (`python benchmarks/planner_accuracy.py`), bf16 without checkpointing on the tiny BERT above."""
    check_against_measurement(
        None,
        [
            Trial(None, "fp32", False, "adamw", 16, 1, 128, steps=2),
            Trial(None, "fp32", True, "adafactor", 8, 1, 128, steps=2),
            Trial(None, "bf16", True, "adamw8bit", 8, 1, 64, steps=2),
        ],
    )


# -- causal language models (issue #14) ----------------------------------------------------------------------------
def llama_config_json(vocab: int = 3000, tied: bool = False) -> str:
    """A small Llama with grouped-query attention and its own output layer: the logits' share grows with `vocab`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        max_position_embeddings=256,
        architectures=["LlamaForCausalLM"],
    ).to_json_string()


@pytest.mark.parametrize(("tied", "counted"), [(False, 1.0), (True, 1.0), (False, 0.25)])
def test_causal_lm_logits_carried_to_the_real_vocabulary(tied, counted):
    """The proxies run at vocabularies of 512 and 1,024; what they predict at 3,000 equals a one-layer model counted
    at 3,000 itself (what the fused head and loss keep for backward grows with the vocabulary: the head's weight
    gradient, taken in the forward pass, and the hidden states' gradient; autocast's bf16 copy of the output layer
    does too). The loss runs at the counted positions only, as the task computes it: every position but the last,
    or a quarter of them (instruction tuning)."""
    from leantrain.tasks.causal_lm import head_loss_works, head_rows_work

    config_json = llama_config_json(3000, tied)
    for precision in ("fp32", "bf16"):
        profile = M.activation_profile(config_json, 64, precision, False, counted=counted)
        net = M._build(M._config_from_json(config_json, num_hidden_layers=1), "cpu").train()
        assert head_rows_work(net) and head_loss_works(net) and profile.fused_head
        saved = M._saved_bytes(net, 4, 64, precision, counted=counted, counted_logits=True, fused=True)
        predicted = 4 * (profile.base + profile.per_layer) + profile.copies_base + profile.copies_per_layer
        assert predicted == pytest.approx(saved, rel=0.01), precision


def test_a_frozen_tied_head_is_planned_without_its_weight_gradient():
    """preset:tiny-llama's output layer is its embedding matrix: `--freeze embeddings` freezes both, and the fused
    head and loss then take no weight gradient in the forward pass, which the proxies (trained whole) do: planned
    within 2% of what the frozen model saves (counted with it, 10% over)."""
    from leantrain.model import freezing
    from leantrain.tasks.causal_lm import head_loss_works, head_rows_work

    facts = M.model_facts("preset:tiny-llama")
    net = M._build(M._config_from_json(facts.config_json), "cpu").train()
    freezing.apply(net, "embeddings")
    batch = M.proxy_batch(net.config, 8, 128, torch.Generator().manual_seed(0))
    fused = head_rows_work(net) and head_loss_works(net)
    measured = saved_bytes(net, lambda: M.proxy_loss(net, batch, None, None, True, fused))
    profile = M.activation_profile(facts.config_json, 128, "fp32", False)
    planned = profile.saved(8, facts.layers, False) - M._untaken_head_gradient(facts, profile, None, "embeddings")
    assert fused and planned == pytest.approx(measured, rel=0.02)


def test_causal_lm_facts_and_plan_know_the_task(without_lora_notes):
    """A causal LM is planned (it was refused: "text encoders only"), with its vocabulary, and its FLOPs counted as the
    run's telemetry counts them, attention's term in the sequence length included."""
    from leantrain.planner.search import PlanRequest, make_plan
    from leantrain.telemetry.flops import counted_flop_model

    facts = M.model_facts("preset:tiny-llama")
    assert (facts.kind, facts.vocab, facts.layers) == ("causal-lm", 8192, 4)
    one = dict(precisions=("fp32",), optimizers=("adamw",), checkpointing=(False,))  # few proxies: 4 s, not 12
    plan = make_plan(PlanRequest(model="preset:tiny-llama", budget=2**30, global_batch=16, seq_len=256, **one))
    flops = counted_flop_model(M._build(M._config_from_json(facts.config_json), "meta")).batch_flops(1, 256)
    assert plan.facts["flops_per_sequence"] == pytest.approx(flops)
    assert flops > 6 * facts.params * 256 * 1.01  # more than 6 x parameters: attention's s^2 term
    assert plan.recommended is not None
    with pytest.raises(ConfigError, match=r"causal language models and encoder-decoders .* planned by hand"):
        M.model_facts("preset:tiny-vit")


@pytest.mark.slow  # 3 trials, each warmed up: 60 s at load 2.5
def test_causal_lm_predicted_peak_within_10_percent_of_measured():
    """preset:tiny-llama (vocabulary 8,192: the logits outweigh the layers) packed rows, each part of the causal-LM
    model: every activation with the logits' gradients at the start of backward (without them: -30%), checkpointed
    layers whose peak is at the loss, before any layer is recomputed (adding the recomputed layer as for an
    encoder: +14%), and accumulation. The bar is 10%, not 15%: measured errors are within 2% (seven trials on three
    architectures within 4%, benchmarks/results/planner_accuracy.md), and the checkpointing term needs the tighter bar
    to bite."""
    m = "preset:tiny-llama"
    check_against_measurement(
        m,
        [
            Trial(m, "fp32", False, "adamw", 16, 1, 128, steps=2),
            Trial(m, "fp32", True, "adamw", 16, 1, 128, steps=2),
            Trial(m, "fp32", False, "adafactor", 8, 2, 128, steps=2),
            # instruction tuning: the next token counts at 1 position in 16, the logits are computed there only
            Trial(m, "fp32", False, "adamw", 16, 1, 128, steps=2, counted=1 / 16),
        ],
        tolerance=0.10,
    )


@pytest.mark.slow  # measures in a new Python process: 1 trial, warmed up (30 s at load 4)
def test_a_tied_causal_lm_at_a_small_micro_batch_peaks_at_the_end_of_backward():
    """preset:tiny-llama's output layer is its embedding matrix: at the end of backward every gradient is made, that
    matrix's among them (the head's share), when the embedding lookup makes its dense gradient once more, to be
    added to it. At one row of 64 tokens its activations weigh less than that, and the end of backward is the peak,
    above the optimizer step by an embedding matrix (8 MiB) under AdamW: predicted 7.7% under the measured peak
    (2026-12-06); without that candidate, 15-17% under."""
    m = "preset:tiny-llama"
    facts = M.model_facts(m)
    e = M.estimate(facts, 1, 64, "fp32", False, "adamw")
    assert e.phase == "end of backward" and e.steady_peak > e.weights + e.optimizer_state + e.gradients
    check_against_measurement(m, [Trial(m, "fp32", False, "adamw", 1, 1, 64, steps=2)])


def test_flat_parameters_gradients_are_planned_alive_through_backward(tiny_model_dir):
    """Flat parameters keep the small parameters' gradients allocated between steps (`model.flat`): without
    accumulation they are at backward's peak too, the large ones' not; with it all are, either way."""
    import math

    from leantrain.model.flat import LARGEST

    facts = M.model_facts(str(tiny_model_dir))
    small = sum(math.prod(s) for s in facts.inventory.shapes if math.prod(s) <= LARGEST)
    assert small > 0
    plain, flat = (M.estimate(facts, 64, 128, "fp32", False, "adamw", 1, flat=f) for f in (False, True))
    assert plain.phase == "backward"  # activations decide this peak
    assert flat.peak - plain.peak == 4 * small
    accumulating = [M.estimate(facts, 64, 128, "fp32", False, "adamw", 2, flat=f).peak for f in (False, True)]
    assert accumulating[0] == accumulating[1]
