import sys

from leantrain.commands.cli import entry

sys.exit(entry())
