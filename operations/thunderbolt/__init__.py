"""
The Thunderbolt layers: the ``thunderbolt_net`` driver and the link it carries.

``driver`` (which build is loaded, the candidate's checks, the swap) and
``link`` (the ThunderboltIP link retrained at the expected speed, and the peer
answering across it), and ``driver_reading`` and ``link_reading`` (what a
harness reads of a host for each layer, and each layer's judge of it).

It owns the kernel module and the link, and reads the site's settings as the
other layers do; it must not touch serving or the gateway, which share its
floor: it is given concrete values (a candidate, a rate, an address) by the
runbook, and they are given none of its.
"""
