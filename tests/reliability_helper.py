"""`leantrain train` in a subprocess that trains slowly or is killed mid-publish (tests/test_reliability.py).

    python tests/reliability_helper.py train --model ... --output-dir ...

Environment, all optional:
  LT_TEST_STEP_SLEEP=S        sleep S seconds before each optimizer step (a test can signal the run mid-training)
  LT_KILL_AFTER_PUBLISHED=N   SIGKILL this process right after the N-th output has been moved into place

Nothing here changes what a step computes: the patches only wait or kill.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from leantrain.commands.cli import main as cli_main
    from leantrain.run import directory
    from tests.hooks import install_from_environment

    install_from_environment()

    if "LT_KILL_AFTER_PUBLISHED" in os.environ:
        after = int(os.environ["LT_KILL_AFTER_PUBLISHED"])
        publish = directory.RunDir._publish_from
        real_replace = os.replace

        def publish_then_die(self, staging):
            moved = [0]

            def replace(src, dst):
                real_replace(src, dst)
                if os.path.dirname(os.fspath(src)) == os.fspath(staging):  # an output moved into place
                    moved[0] += 1
                    if moved[0] == after:
                        os.kill(os.getpid(), signal.SIGKILL)

            directory.os.replace = replace  # type: ignore[attr-defined]
            try:
                return publish(self, staging)
            finally:
                directory.os.replace = real_replace  # type: ignore[attr-defined]

        directory.RunDir._publish_from = publish_then_die

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
