"""Fixtures shared by the operator modules that run kopf against the kmock emulator.

Each such module defines its own module-scoped ``emulator`` (what it registers differs); ``kube``
is the same everywhere: the kubernetes clients pointed at that module's emulator."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def kube(emulator):
    """(CustomObjectsApi, ApiClient) talking to this module's emulator."""
    import kubernetes  # noqa: PLC0415 (the operator extra; only the emulator modules ask for it)

    cfg = kubernetes.client.Configuration()
    cfg.host = emulator.url
    api = kubernetes.client.ApiClient(cfg)
    return kubernetes.client.CustomObjectsApi(api), api
