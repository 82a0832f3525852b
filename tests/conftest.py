"""Shared pytest set-up: async tests run on asyncio through anyio's plugin."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CHECKFU_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long run; set CHECKFU_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
