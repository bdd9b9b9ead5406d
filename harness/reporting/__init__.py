"""
Reporting: a measurement's JSON and Markdown (``report``) and the schema a
comparison reads it back with (``report_schema``), comparisons and charts over
reports (``compare``, ``linktest_report``), SGLang's ``bench_serving`` lines
(``bench_serving``) and what a result does not prove (``caveats``).

May import: ``harness.measuring``, ``harness.judging``, ``harness.hosts``,
``harness.progress`` and ``operations``; never a run.
"""
