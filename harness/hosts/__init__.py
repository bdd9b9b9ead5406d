"""
Reading the hosts: the site's topology with each host's typed settings, the
commands that read a host in one SSH round trip (``remote``), which declared
state the hosts are in (``status``), what is wrong when they are in none
(``diagnose``), and the link's and the workstations' counters around a window
(``counters``). Each reading is a layer's own, from ``operations/``; nothing
here changes a host.

May import: ``operations`` and ``harness.progress``. Every other package of
the harness builds on this one.
"""
