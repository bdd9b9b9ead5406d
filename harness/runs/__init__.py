"""
The runs ``experiment.py`` starts: measuring a state (``measure``), the
campaign over states and trials (``campaign``), the soak and the events it
causes (``soak``, ``events``), the linktest (``linktest``) and the
compatibility matrix's ledger records (``matrix``).

The top of the harness: may import every other package of it; nothing of the
harness imports a run.
"""
