import sys

from llog.cli import main

sys.exit(main())
