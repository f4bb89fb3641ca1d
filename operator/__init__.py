"""The TideMQ Kubernetes operator (kopf), imported as ``tidemq.operator``.

The folder ``operator/`` is mapped into the ``tidemq`` namespace by pyproject.toml and is never
importable as the top-level ``operator`` (that name stays the standard library's). Kubernetes
objects are built by pure functions (:mod:`tidemq.operator.workloads`); the CRDs live in ``crds/``
(:mod:`tidemq.operator.crds`). The operator reaches brokers only through ``tidemq.client.Admin``.
"""
