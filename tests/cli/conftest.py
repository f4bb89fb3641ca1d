"""One name server + broker shared by every CLI test module (topic and group names are unique per
test), so the folder stays fast."""

from __future__ import annotations

import pytest

from tests.conftest import _start


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    c = _start(tmp_path_factory)
    yield c
    c.stop()
