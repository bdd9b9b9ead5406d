"""
The gateway layer: the LiteLLM proxy and the user's route through it.

``proxy`` (the proxy's config and service, with or without the temporary
fallback ``small -> large``) and ``route`` (the proofs of the user's route: a
role that answers, a forced fallback served by ``large``).

It owns the public roles; it must not touch the workstations' serving, the
driver or the link: it reaches the backends only through the requests a user
would send.
"""
