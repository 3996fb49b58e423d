"""--profile-steps: a Chrome trace of N steps after the first and the time by kind of work (issue #16)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from leantrain import TrainConfig, train
from leantrain.telemetry import profiler as prof


def chain(*names: str):
    """A profiler event with callers: chain("aten::addmm", "aten::linear") is addmm called by linear."""
    parent = None
    for name in reversed(names):
        parent = SimpleNamespace(name=name, cpu_parent=parent)
    return parent


@pytest.mark.parametrize(
    "names, category",
    [
        (("aten::addmm", "aten::linear"), prof.MATMULS),
        (("aten::mm", "autograd::engine::evaluate_function: MmBackward0"), prof.MATMULS),
        (("aten::empty", "aten::native_layer_norm", "aten::layer_norm"), prof.NORMS),  # a composite's pieces
        (("aten::_softmax", "aten::softmax"), prof.ATTENTION),
        (("aten::_scaled_dot_product_flash_attention_for_cpu_backward",), prof.ATTENTION),
        (("aten::index_add_", "aten::embedding_dense_backward"), prof.EMBEDDING),
        (("aten::copy_", "aten::_to_copy", "aten::to"), prof.CASTS),
        (("aten::mul_", "aten::_foreach_mul_", "Optimizer.step#AdamW.step"), prof.OPTIMIZER),
        (("aten::stack", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"), prof.DATA),
        (("aten::nll_loss_forward", "aten::nll_loss", "aten::cross_entropy_loss"), prof.LOSS),
        (("aten::_log_softmax", "aten::log_softmax"), prof.LOSS),  # a loss's, not attention's softmax
        (("aten::mm", prof.FUSED_HEAD_LOSS), prof.MATMULS),  # the output head fused with its loss
        (("aten::exp_", prof.FUSED_HEAD_LOSS), prof.LOSS),
        (("aten::fill_", "aten::zero_", "aten::zeros_like", prof.FUSED_HEAD_LOSS), prof.LOSS),
        (("aten::add",), prof.OTHER_OPS),
        (("autograd::engine::evaluate_function: AddBackward0",), prof.FRAMEWORK),
    ],
)
def test_each_operator_is_charged_by_what_it_ran_inside(names, category):
    assert prof.categorise(chain(*names)) == category


def test_the_categories_add_up_to_the_wall_time():
    cpu = SimpleNamespace(name="CPU")

    def event(seconds, *names):
        return SimpleNamespace(**vars(chain(*names)), device_type=cpu, self_cpu_time_total=seconds * 1e6)

    events = [event(0.5, "aten::addmm", "aten::linear"), event(0.2, "aten::add"), event(0.1, "aten::_softmax")]
    summary = prof.summarise(events, wall_seconds=1.0, steps=2)
    seconds = {k: v["seconds"] for k, v in summary["categories"].items()}
    assert seconds[prof.MATMULS] == pytest.approx(0.5) and seconds[prof.OTHER_OPS] == pytest.approx(0.2)
    assert seconds[prof.PYTHON] == pytest.approx(0.2)  # the wall time no operator accounts for
    assert sum(seconds.values()) == pytest.approx(1.0)
    assert sum(v["share"] for v in summary["categories"].values()) == pytest.approx(1.0)


def test_on_a_gpu_kernel_time_is_charged_to_the_operator_that_launched_it():
    cpu = SimpleNamespace(name="CPU")

    def event(host, kernel, *names):
        return SimpleNamespace(
            **vars(chain(*names)), device_type=cpu, self_cpu_time_total=host * 1e6, self_device_time_total=kernel * 1e6
        )

    events = [
        event(0.01, 0.6, "aten::addmm", "aten::linear"),
        event(0.01, 0.1, "aten::_softmax"),
        event(0.1, 0, "aten::add"),
    ]
    summary = prof.summarise(events, wall_seconds=1.0, steps=2)
    device = {k: v["seconds"] for k, v in summary["device_categories"].items()}
    assert device == pytest.approx({prof.MATMULS: 0.6, prof.ATTENTION: 0.1, prof.GPU_IDLE: 0.3})
    assert "GPU kernel time" in prof.format_summary(summary, 2)
    # on a CPU no operator launches kernels: no device table
    cpu_only = prof.summarise([event(0.5, 0, "aten::addmm")], wall_seconds=1.0, steps=2)
    assert "device_categories" not in cpu_only


def test_a_run_with_profile_steps_writes_a_trace_of_those_steps_and_the_summary(
    tiny_model_dir, sentiment_csv, tmp_path, capsys
):
    base = dict(
        model=str(tiny_model_dir),
        data=str(sentiment_csv),
        cache_dir=str(tmp_path / "cache"),
        max_steps=5,
        batch_size=8,
        progress=False,
        report=False,
        precision="fp32",
    )
    result = train(TrainConfig(**base, profile_steps=2, output_dir=str(tmp_path / "run")))
    folder = result.output_dir / "profile"
    trace = json.loads((folder / "trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("Optimizer.step") for n in names) and "aten::addmm" in names
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["wall_seconds"] > 0
    seconds = {k: v["seconds"] for k, v in summary["categories"].items()}
    assert seconds[prof.MATMULS] > 0 and seconds[prof.OPTIMIZER] > 0 and seconds[prof.DATA] > 0
    err = capsys.readouterr().err
    assert "profile of steps 2-3" in err and "matmuls" in err

    plain = train(TrainConfig(**{**base, "max_steps": 2}, output_dir=str(tmp_path / "plain")))
    assert not (plain.output_dir / "profile").exists()


def test_profile_steps_must_be_positive():
    from leantrain.errors import ConfigError

    with pytest.raises(ConfigError, match="profile"):
        TrainConfig(profile_steps=0)


def test_the_fused_head_loss_is_named_in_the_trace_as_the_summary_expects():
    import torch

    from leantrain.model.losses import head_cross_entropy_sum

    hidden, weight = torch.randn(6, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True)
    with torch.profiler.profile() as trace:
        head_cross_entropy_sum(hidden, weight, None, torch.tensor([0, 1, 2, 3, 4, 5])).backward()
    names = {e.name for e in trace.events()}
    assert prof.FUSED_HEAD_LOSS in names
    softmax = next(e for e in trace.events() if e.name == "aten::_log_softmax")
    assert prof.categorise(softmax) == prof.LOSS
