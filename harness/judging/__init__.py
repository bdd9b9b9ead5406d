"""
Judging results: intervals and verdicts over trials (``intervals``), what the
link allows a token (``roofline``), whether a window was measured clean
(``disturbance``), and the field report's figures that results stand beside
(``field_report``). Pure functions of readings and figures: no host, no clock.

May import: ``harness.hosts`` (the readings it judges) and ``operations``.
"""
