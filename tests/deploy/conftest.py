"""The chart loaded once per test module, for every chart test (tests/deploy/test_chart*.py)."""

import pytest

from tests.deploy.test_chart import load_chart


@pytest.fixture(scope="module")
def chart():
    return load_chart()
