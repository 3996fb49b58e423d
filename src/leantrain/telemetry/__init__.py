"""What a run tells the user: console lines, the per-step log, throughput and the final summary."""

from leantrain.telemetry.console import Console
from leantrain.telemetry.metrics import MetricsLog, TeeLog, Throughput, summary_table

__all__ = ["Console", "MetricsLog", "TeeLog", "Throughput", "summary_table"]
