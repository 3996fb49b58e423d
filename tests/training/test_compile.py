"""--compile: the compiled model trains as the eager one does, and compiling is timed apart."""

import pytest

from tests.conftest import max_diff
from tests.training.test_equivalence import loss_log, run  # noqa: F401  (run is a fixture)


def test_a_compiled_model_trains_like_the_eager_one(run):  # noqa: F811
    eager, w_eager = run(batch_size=16, max_steps=3)
    compiled, w_compiled = run(batch_size=16, max_steps=3, compile=True)
    # inductor fuses and reorders float arithmetic: close, not bitwise
    assert loss_log(compiled) == pytest.approx(loss_log(eager), abs=1e-4)
    assert max_diff(w_eager, w_compiled) <= 1e-4
    assert eager.metrics["compile_seconds"] is None
    # the forward and backward graphs are compiled before the clock starts: their cost is reported here
    assert compiled.metrics["compile_seconds"] > 0
    assert compiled.metrics["compile_seconds"] > compiled.metrics["train_seconds"] / 10
