import torch

from leantrain.model.training_speed import measure_training_speed


def test_a_real_measurement_of_the_embedded_classifier_leaves_the_random_state_alone(minilm_dir):
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    speed = measure_training_speed(str(minilm_dir), "fp32", batch=4, length=8, steps=1)
    assert torch.equal(torch.random.get_rng_state(), before)  # the run seeds after; a caller may not
    assert 0 < speed < 1e5
