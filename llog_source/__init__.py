"""The llog source for Spark: ``spark.readStream.format("llog")`` and ``spark.read.format("llog")``
(Spark finds it through :mod:`pyspark_llog`)."""
