"""
The serving layer: SGLang on the workstations, and the router in front of them.

``sglang`` (a replica or one TP rank per workstation, and the proof of a real
completion), ``router`` (sglang-router on the gateway, in front of the
replicas), ``transport`` (where the TP group's bytes go), ``gpu`` (the GPUs
free for what the state runs) and ``reading`` (what a harness reads of a host
for the layer, and the layer's judge of it).

It owns the inference processes; it must not touch the driver, the link or the
gateway's proxy: it reads the host's settings and the declared state's serving
and speculative axes.
"""
