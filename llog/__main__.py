"""``python -m llog`` ran the ``llog`` command until the command moved out of the protocol core
into :mod:`llog_tools` (which the core never imports): say where it is now."""

import sys

sys.exit("llog: the command is `llog` (the console script) or `python -m llog_tools`; the llog package is "
         "the protocol core and runs no command")
