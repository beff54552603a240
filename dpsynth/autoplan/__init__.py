"""Derived plans (``--preset auto``): a throughput probe (:mod:`.probe`), the sizing rules (:mod:`.rules`), the
memory estimate of a DP-SGD chunk (:mod:`.memory`) and the plan written into a run's config (:mod:`.plan`)."""
