"""
The Thunderbolt layers: the ``thunderbolt_net`` driver and the link it carries.

``driver`` (which build is loaded, the candidate's checks, the swap),
``link`` (the ThunderboltIP link retrained at the expected speed, and the peer
answering across it), ``module_file`` (what a kernel module file declares,
read on the operator's machine), and ``driver_reading`` and ``link_reading``
(what a harness reads of a host for each layer, and each layer's judge of it).

It owns the kernel module and the link; it must not touch serving, the gateway
or the site model: it is given concrete values (a candidate, a rate, an
address) by the runbook.
"""
