"""Techniques on the model: loading (`loading`, `presets`), LoRA, the attention kernel, losses, optimizers and
schedules. Below the data and the tasks, which build on them."""
