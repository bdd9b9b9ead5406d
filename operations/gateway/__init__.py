"""
The gateway layer: the LiteLLM proxy and the user's route through it.

``proxy`` (the proxy's config and service, with or without the temporary
fallback ``small -> large``), ``route`` (the proofs of the user's route: a
role that answers, a forced fallback served by ``large``) and ``reading``
(what a harness reads of the gateway for the layer, and the layer's judge of it).

It owns the public roles; it must not touch the workstations' serving, the
driver or the link: it reaches the backends only through the requests a user
would send.
"""
