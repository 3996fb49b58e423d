"""A run's artefacts on disk: the run directory staged and published atomically (`directory`), checkpoints and the
train state (`checkpoint`), the model card, the report page and the comparison of runs."""
