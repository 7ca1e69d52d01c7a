"""``python -m compaction_job ARGS``: the compaction job on a local Spark (or the one that
launched this process)."""

import sys

from compaction_job.job import main

sys.exit(main())
