"""
Measuring: the client that asks the serving endpoint (``client``), the
server's own figures (``server_stats``), samples over a sweep (``sweep``), the
profiler's traces (``traces``) and window (``profile``), and every window, each
one declaration (``windows``).

May import: ``harness.judging``, ``harness.hosts``, ``harness.progress`` and
``operations``; never a report or a run.
"""
