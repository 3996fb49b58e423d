"""`python -m leantrain.parallel.agent MODULE ARGS...`: run a launcher module (`accelerate.commands.launch`,
`torch.distributed.run`) as `python -m MODULE ARGS...` would, with one difference: when a signal stops the job,
the launcher's agent exits 128 + the signal's number instead of printing its own SignalException traceback
(each process has already said what it saved and how to resume; training/interrupt.py)."""

from __future__ import annotations

import runpy
import sys


def main() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
