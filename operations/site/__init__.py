"""
The site: the inventory's data and the run's command line, as typed values.

``model`` (the site file's schema, the only one), ``settings`` (one typed
object per host, built from it once), ``listing`` (a site given as its
hosts' inventory data: what the embedded lab writes), ``overrides`` (a ``--data`` item checked
as the site's value would be), ``options`` (the run's own ``--data`` options,
and the rollback's keys apart), ``hosts`` (the inventory's entries),
``syntax`` (what a value may hold to be written into a unit, a script, an
ssh_config), ``releases`` (what the supported SGLang releases accept).

It owns what the operator wrote; it must not touch a host, nor import the
layers that read it (serving, the gateway, the driver and the link) or the
run. Below it: the declared states and the plumbing, whose module reader
checks a candidate file at load.
"""
