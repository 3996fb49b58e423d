"""Model FLOPs: the closed form for BERT-like encoders, checked by hand and against FlopCounterMode; MFU."""

from __future__ import annotations

import pytest
import torch

from leantrain.telemetry.flops import (
    FlopMeter,
    FlopModel,
    count_flops,
    counted_flop_model,
    encoder_flop_model,
    flop_model,
    mfu,
)


def tiny_bert_config(num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=num_labels,
    )


def meta_bert(num_labels: int = 2):
    from transformers import BertForSequenceClassification

    with torch.device("meta"):
        return BertForSequenceClassification(tiny_bert_config(num_labels))


def test_formula_matches_the_hand_computed_count_for_a_tiny_bert():
    # h = 64, i = 128, L = 2 layers, C = 2 labels.
    # One layer's parameters:
    #   attention Q, K, V, O   4 * (64*64 + 64)             = 4 * 4160        = 16640
    #   feed-forward           (64*128 + 128) + (128*64 + 64) = 8320 + 8256    = 16576
    #   two LayerNorms         2 * (64 + 64)                                   =   256
    #   total                                                                   = 33472
    # per token (fwd + bwd): 6 * 2 layers * 33472                              = 401664
    # attention per sequence: 12 * 2 layers * 64 * s^2                          = 1536 * s^2
    # head per sequence: 6 * (pooler 64*64 + 64 + classifier 64*2 + 2) = 6 * 4290 = 25740
    # a padded batch of 4 x 16: 4 * (25740 + 401664*16 + 1536*16*16)
    #                         = 4 * (25740 + 6426624 + 393216) = 4 * 6845580     = 27382320
    model = encoder_flop_model(tiny_bert_config(num_labels=2))
    assert model.per_token == 401664
    assert model.per_token_sq == 1536
    assert model.per_sequence == 25740
    assert model.batch_flops(4, 16) == 27382320
    assert model.sequence_flops([16, 16, 16, 16]) == 27382320
    assert model.sequence_flops([3, 5]) == 2 * 25740 + 401664 * 8 + 1536 * (9 + 25)


def test_the_parameter_counts_in_the_formula_are_the_models():
    model = meta_bert(num_labels=2)
    per_layer = sum(p.numel() for p in model.bert.encoder.layer[0].parameters())
    head = sum(p.numel() for p in model.bert.pooler.parameters()) + sum(
        p.numel() for p in model.classifier.parameters()
    )
    assert per_layer == 33472 and head == 4290


@pytest.mark.parametrize("batch,seq", [(4, 16), (8, 64), (2, 128)])
def test_formula_agrees_with_flop_counter_mode_within_a_few_percent(batch, seq):
    formula = encoder_flop_model(tiny_bert_config()).batch_flops(batch, seq)
    counted = count_flops(meta_bert(), seq, batch_size=batch)
    # The formula counts biases and LayerNorms at 6 FLOPs per parameter (the usual convention);
    # FlopCounterMode counts matrix products only: (9h + i) / (4h^2 + 2hi) = 2% more here.
    assert formula == pytest.approx(counted, rel=0.03)
    assert formula >= counted


def test_the_counted_polynomial_reproduces_direct_counts():
    fitted = counted_flop_model(meta_bert())
    assert "counted" in fitted.source
    for batch, seq in ((1, 24), (3, 100)):
        assert fitted.batch_flops(batch, seq) == pytest.approx(count_flops(meta_bert(), seq, batch), rel=1e-9)


def test_models_outside_the_closed_form_are_counted():
    from transformers import GPT2Config, GPT2ForSequenceClassification

    config = GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=256, pad_token_id=0, bos_token_id=0, eos_token_id=0
    )
    with torch.device("meta"):
        model = GPT2ForSequenceClassification(config)
    fm = flop_model(model)
    assert fm.source.startswith("counted")
    # a GPT-2 block has 12 h^2 weights: about 6 * 2 layers * 12 * 64^2 FLOPs per token, plus attention
    assert fm.per_token == pytest.approx(6 * 2 * 12 * 64 * 64, rel=0.1)
    assert fm.per_token_sq > 0


def test_bert_models_use_the_formula():
    assert flop_model(meta_bert()).source.startswith("formula: bert")


def test_minilm_is_about_65_mflop_per_token(minilm_dir):
    from transformers import AutoConfig

    fm = encoder_flop_model(AutoConfig.from_pretrained(minilm_dir), num_labels=3)
    assert fm.per_token == pytest.approx(63.88e6, rel=1e-3)
    assert fm.per_padded_token(60) == pytest.approx(65.5e6, rel=0.01)


def test_mfu_with_a_fixed_peak():
    assert mfu(2e12, 4.0, 1e12) == pytest.approx(0.5)
    assert mfu(1e12, 1.0, None) is None
    assert mfu(1e12, 0.0, 1e12) is None


def test_flop_meter_counts_padded_and_useful_flops():
    fm = FlopModel(per_sequence=10.0, per_token=100.0, per_token_sq=1.0, source="test")
    meter = FlopMeter(fm, peak_flops_per_second=1e4)
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    padded = meter.add(ids, mask)
    assert padded == 2 * (10 + 400 + 16)
    assert meter.useful_flops == 2 * 10 + 100 * 6 + (16 + 4)
    row = meter.metrics(seconds=0.1)
    assert row["mfu"] == pytest.approx(padded / 0.1 / 1e4)
    assert row["mfu_useful"] == pytest.approx((20 + 600 + 20) / 0.1 / 1e4)
    assert row["model_tflops_per_second"] == pytest.approx(padded / 0.1 / 1e12)
    meter.add(ids)  # no mask: every position is real
    assert meter.useful_flops == 2 * 10 + 100 * 6 + 20 + padded


def test_steady_mfu_leaves_out_the_warm_up_steps():
    fm = FlopModel(per_sequence=0.0, per_token=100.0, per_token_sq=0.0, source="test")
    meter = FlopMeter(fm, peak_flops_per_second=1e4)
    ids = torch.zeros(1, 10, dtype=torch.long)
    meter.add(ids)  # a warm-up step: 1,000 FLOPs
    meter.mark()
    meter.add(ids)
    meter.add(ids)  # 2,000 FLOPs after the warm-up
    steady = meter.steady_metrics(seconds=0.1)
    assert steady["steady_mfu"] == pytest.approx(2000 / 0.1 / 1e4)
    assert steady["steady_model_tflops_per_second"] == pytest.approx(2000 / 0.1 / 1e12)
    assert meter.metrics(seconds=0.1)["mfu"] == pytest.approx(3000 / 0.1 / 1e4)


def test_wrapped_models_are_unwrapped():
    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    assert flop_model(Wrapper(meta_bert())).source.startswith("formula: bert")


def test_frozen_weights_are_counted_without_weight_gradients():
    """A linear probe (the encoder frozen, the classifier trains), counted by hand: a frozen layer whose input needs
    no gradient runs forward only, 2 FLOPs per weight per token; the classifier's backward computes its weight
    gradient but no input gradient (the pooler is frozen). Matrix products only, as FlopCounterMode counts them.
      per token:    2 * 2 layers * (4 * 64*64 + 2 * 64*128) = 4 * 32768           = 131072
      per s^2:      attention forward, 4 * 64 * 2 layers                            = 512
      per sequence: pooler forward 2 * 64*64 + classifier 2 * 64*2 forward + 2 * 64*2 weight gradient = 8704"""
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification(tiny_bert_config())
    for p in model.bert.parameters():
        p.requires_grad_(False)
    counted = flop_model(model)
    assert (counted.per_token, counted.per_token_sq, counted.per_sequence) == pytest.approx((131072, 512, 8704))
    assert "frozen weights get no gradients" in counted.source
    assert all(p.device.type == "cpu" for p in model.parameters())  # the meta copy left the model alone


def test_lora_costs_less_than_full_fine_tuning_and_more_than_a_probe():
    """LoRA on query and value: the frozen weights' backward is the input gradient alone (about 4 FLOPs per weight
    per token instead of 6), plus the adapters' own small products."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertForSequenceClassification

    full = flop_model(BertForSequenceClassification(tiny_bert_config()))
    lora = flop_model(
        get_peft_model(
            BertForSequenceClassification(tiny_bert_config()),
            LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=["classifier"]),
        )
    )
    probe_per_token = 131072
    assert probe_per_token < lora.per_token < 0.7 * full.per_token
    assert "frozen weights get no gradients" in lora.source


def test_a_wav2vec2_classifier_is_counted_by_hand_despite_spec_augment():
    """SpecAugment (on by default) masks frames with `nonzero`, which the meta device cannot run: the count read 0
    and so did MFU. Counted by hand for half a second at 16 kHz (8000 samples), forward + backward = 3 forward:
      feature encoder  conv 1->16 k10 s5 (1599 frames), 16->16 k4 s4 (399 frames): 3 * 2 * (1599*160 + 399*1024)
      projection 16->32, the positional conv (32 wide, k16, 2 groups, 400 frames), one layer, projector 32->16:
                       6 * 399 * (512 + 4*32*32 + 2*32*64 + 512) + 6 * 400 * 32*16*16 + 12 * 32 * 399**2
      classifier       6 * 16*2 on the pooled vector
    The encoder asks for its input's gradient (for gradient checkpointing), so the first conv's is counted too; the
    grouped conv's weight gradient is counted once, not once per group (torch's formula leaves the groups out)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    config = Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        classifier_proj_size=16, layerdrop=0.9,  # skips the layer in 9 of 10 training passes
    )  # fmt: skip
    assert config.apply_spec_augment and config.mask_time_prob > 0
    model = Wav2Vec2ForSequenceClassification(config)
    by_hand = (
        6 * (1599 * 160 + 399 * 1024)
        + 6 * 399 * (512 + 4 * 32 * 32 + 2 * 32 * 64 + 512) + 6 * 400 * 32 * 16 * 16 + 12 * 32 * 399**2
        + 6 * 16 * 2
    )  # fmt: skip
    for _ in range(3):  # the whole model's count every time, LayerDrop or not
        counted = flop_model(model, {"input_values": (1, 8000)})
        assert counted.per_sequence == by_hand, counted.source
    assert model.config.apply_spec_augment and model.config.layerdrop == 0.9  # the model trains as configured


def test_a_quantized_base_is_estimated_without_bitsandbytes_warning_of_its_meta_copy(caplog):
    """A 4-bit layer's meta copy has no quantization state: bitsandbytes logs so (twice, once an input tried) and
    the count fails; the estimate is used, and the warning, about a copy that never trains, is not shown."""
    pytest.importorskip("bitsandbytes")
    from transformers import BertForSequenceClassification

    from leantrain.model.lora import _quantized_linear

    model = BertForSequenceClassification(tiny_bert_config())
    for p in model.bert.parameters():
        p.requires_grad_(False)
    attention = model.bert.encoder.layer[0].attention.self
    attention.query = _quantized_linear(attention.query, "4bit", torch.device("cpu"))
    with caplog.at_level("WARNING"):
        counted = flop_model(model)
    assert "estimated for frozen weights" in counted.source and counted.per_token > 0
    assert not [r for r in caplog.records if "quantization state not initialized" in r.getMessage()]
    out = model(input_ids=torch.ones(1, 8, dtype=torch.long)).logits  # the model itself still runs
    assert torch.isfinite(out).all()


def test_the_counts_are_torch_flop_counter_modes():
    """`counting` leaves out FlopCounterMode's module tracking, not a product: an encoder-decoder's and a Llama's
    forward and backward on the meta device give FlopCounterMode's totals."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel, LlamaConfig, LlamaForCausalLM

    from leantrain.telemetry.flops import count_pair_flops, counting

    shape = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    with torch.device("meta"):
        llama = LlamaForCausalLM(LlamaConfig(**shape, num_key_value_heads=1))
        config = EncoderDecoderConfig.from_encoder_decoder_configs(
            BertConfig(**shape), BertConfig(**shape, is_decoder=True, add_cross_attention=True)
        )
        pair = EncoderDecoderModel(config)
    ids = torch.zeros(2, 24, dtype=torch.long, device="meta")

    def llama_pass():
        llama(input_ids=ids).logits.float().sum().backward()

    def pair_pass():
        pair(input_ids=ids, decoder_input_ids=ids[:, :9], use_cache=False).logits.float().sum().backward()

    for run in (llama_pass, pair_pass):
        with FlopCounterMode(display=False) as theirs:
            run()
        with counting() as ours:
            run()
        assert ours.get_total_flops() == theirs.get_total_flops() > 0
    assert count_pair_flops(pair, 24, 9) == theirs.get_total_flops() // 2  # one row of the two above
