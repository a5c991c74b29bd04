"""The guest toolkit: what the benchmarks (bench/) and the in-guest tests (vm-tests/guest/) share.

- :mod:`bench.kit.shell`: running commands, logging, reading and writing kernel files;
- :mod:`bench.kit.module`: loading and unloading azswap.ko (and the modules it needs), zswap off;
- :mod:`bench.kit.swapdev`: every system under test as the only swap device (none, zram, zswap,
  azswap, azswap with nothing registered), its stats by name; no fallback: a system that does not
  come up raises :class:`~bench.kit.swapdev.SwapDevError` with the reason;
- :mod:`bench.kit.cgroups`: trees of leaf memory cgroups and reclaim, on controlplane.cgroup;
- :mod:`bench.kit.daemon`: the shipped daemon (`azctl daemon`) as a subprocess, ready when it
  answers (and its prefetcher traces).

Everything here runs as root inside the test kernel (vm-tests/run); nothing runs at import time.
"""
