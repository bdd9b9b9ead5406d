"""
Plumbing: what every layer's steps stand on, and no layer of its own.

``phase`` (executing or only planning, and which hosts an operation concerns),
``facts`` (what facts share, several read as one command), ``reading`` (what
a harness reads of a host for a layer, and the layer's judge of it),
``probes`` (real requests and bounded waits), ``connect`` (pyinfra's SSH
connection with Nagle's algorithm off, bounded when it drops), ``venvs``
(pinned Python packages) and ``module_file`` (what a kernel module file
declares, read on the operator's machine: the site model checks a candidate
with it, the driver layer loads one).

It imports nothing else of twinbolt's: it knows no layer, no state, no site.
"""
