"""`leantrain train` in a subprocess that can be made slow, or killed at a chosen point (tests/test_checkpoint.py).

    python tests/checkpoint_helper.py train --model ... --save-every 2

Environment, all optional:
  LT_TEST_STEP_SLEEP=S     sleep S seconds before each optimizer step (so a test can kill the run mid-epoch)
  LT_KILL_AFTER_SAVE=N     SIGKILL this process right after checkpoint step N is in place
  LT_KILL_MID_SAVE=N       SIGKILL this process while checkpoint step N is being written (after its weights)

Nothing here changes what a step computes: the patches only wait or kill.
"""

from __future__ import annotations

import os
import signal
import sys


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from leantrain.commands.cli import main as cli_main
    from leantrain.run import checkpoint
    from tests.hooks import install_from_environment

    install_from_environment()

    if "LT_KILL_AFTER_SAVE" in os.environ:
        after = int(os.environ["LT_KILL_AFTER_SAVE"])
        save = checkpoint.CheckpointDir.save

        def save_then_die(self, progress, **kwargs):
            path = save(self, progress, **kwargs)
            if progress.step == after:
                _kill()
            return path

        checkpoint.CheckpointDir.save = save_then_die

    if "LT_KILL_MID_SAVE" in os.environ:
        tmp_name = f".{checkpoint.PREFIX}{int(os.environ['LT_KILL_MID_SAVE']):06d}.tmp"
        write = checkpoint._write

        def write_or_die(path, fn):
            if path.parent.name.startswith(tmp_name) and path.name == "optimizer.pt":  # .step-N.tmp-RUN
                _kill()  # model.safetensors and rank-0.pt are written, the rest is not
            return write(path, fn)

        checkpoint._write = write_or_die

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
