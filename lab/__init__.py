"""The embedded lab: three simulated hosts on one Linux machine, reached over real SSH.

Each host is a network namespace with a private mount namespace and its own
init system, systemd (as PID 1 of its own PID namespace) or runit, which runs
its OpenSSH daemon. Only what this kernel cannot do is
simulated (module loading, the Thunderbolt sysfs tree, the GPU, receiver error
counters and the SGLang server), and it is simulated at the real paths and
commands so that twinbolt's own code has no lab branches.
"""
