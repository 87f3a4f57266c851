"""The tests of the PrivateUse1 test device: a DB holding tests/data/device/small.yaml."""

import pytest

from device_helpers import import_small


@pytest.fixture
def small_db(tmp_path):
    return import_small(tmp_path)
