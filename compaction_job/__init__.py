"""The compaction job (``compaction_job.job``): compaction and WAL garbage collection as one
scheduled Spark job. Entry points: ``compaction_job/main.py`` (spark-submit, Databricks) and
``python -m compaction_job``."""
