"""floodwall's data pipeline: telemetry (docs/telemetry.md) to reports and recommended policies.

A PySpark job (``floodwall analyze``; ``pipeline/submit.py`` for ``spark-submit``), installed
with the ``[pipeline]`` extra. Modules: ``schema`` (the explicit read schema), ``files``
(which files a run reads: the date/sidecar layout, ``--since``/``--until``), ``load``
(reading and input quality), ``aggregate`` (the DataFrame aggregations), ``recommend``
(policies from the figures, pure Python), ``report`` (plots and HTML), ``analyze`` (the
whole job), ``synthetic`` (fleet telemetry for tests and benchmarks), ``partition`` (lay a
sidecar's files out by date and sidecar), ``devcluster`` (a Spark standalone cluster from
the installed pyspark).
"""
