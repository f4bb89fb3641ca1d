"""The TideMQ Kubernetes operator (kopf), imported as ``tidemq.operator``.

The folder ``operator/tidemq_operator/`` is mapped into the ``tidemq`` namespace by pyproject.toml.
``operator/`` itself holds no ``__init__.py``: with the repository root on ``sys.path`` it is at most
a namespace-package portion, which never wins over the standard library's ``operator``. Kubernetes
objects are built by pure functions (:mod:`tidemq.operator.workloads`); the CRDs live in ``crds/``
(:mod:`tidemq.operator.crds`). The operator reaches brokers only through ``tidemq.client.Admin``.
"""

# ``kopf run -m tidemq.operator`` imports this package and expects the handlers registered in
# kopf's default registry, so import them here. kopf is an optional dependency (the ``operator``
# extra): the pure modules (workloads, crds, topics, rollout, clusterkey) must stay importable without it,
# hence the guard. Only kopf's absence is tolerated; an error inside the handlers module raises.
try:
    import kopf as _kopf
except ImportError:  # pragma: no cover (kopf not installed: pure modules only)
    pass
else:
    del _kopf  # only its presence matters here; the handlers module imports it itself
    from tidemq.operator import handlers as handlers  # registers the handlers on import
