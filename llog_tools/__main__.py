import sys

from llog_tools.cli import main

sys.exit(main())
