"""The training config: one dataclass per section (`sections`), flat in `TrainConfig`; TrainingArguments names
(`hf_names`); amounts of memory and time (`units`). Every field is a YAML key and a CLI flag."""

from leantrain.config.sections import (
    DATA_FORMATS,
    DEFAULT_JOB_ROWS,
    SCHEDULERS,
    SECTIONS,
    TrainConfig,
    field_base_type,
    field_help,
    refuse_unswitched,
    resolved_values,
    to_flags,
    without_unswitched,
)

__all__ = [
    "DATA_FORMATS",
    "DEFAULT_JOB_ROWS",
    "SCHEDULERS",
    "SECTIONS",
    "TrainConfig",
    "field_base_type",
    "field_help",
    "refuse_unswitched",
    "resolved_values",
    "to_flags",
    "without_unswitched",
]
