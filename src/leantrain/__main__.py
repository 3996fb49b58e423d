import sys

from leantrain.cli import entry

sys.exit(entry())
