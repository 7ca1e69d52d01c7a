"""``spark-submit compaction_job/main.py ARGS`` (and the Databricks ``spark_python_task``): the
compaction job, run as a script.

Run as a script, Python puts this file's directory first on ``sys.path``, not the checkout, so
the checkout is put there too to import ``compaction_job`` and ``llog``. The Spark
tasks import ``compaction_job`` and ``llog`` on the executors: install the llog wheel there
(``databricks.yml`` does), or pass them with ``--py-files``.
"""

import os
import sys

if not __package__:  # run as a script
    _here = os.path.abspath(globals().get("__file__") or sys.argv[0])
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

from compaction_job.job import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
