"""The two labels every object a provider creates carries, so it can be found again without a handle.

``compensate`` and ``listAllocations`` find what a provider holds by these labels
alone, never by an id handed back earlier (a restart or a crash loses ids; labels
stay on the objects). Providers add labels of their own beside these two.
"""

from __future__ import annotations

LABEL_ALLOCATION_KEY = "checkfu.allocation_key"
"""The runner-chosen key of the allocation the object belongs to."""
LABEL_RUNNER_TAG = "checkfu.runner_tag"
"""The tag of the runner that asked for the object."""


def owner_labels(allocation_key: str, runner_tag: str) -> dict[str, str]:
    """The labels naming an object's owner: its allocation key and runner tag."""
    return {LABEL_ALLOCATION_KEY: allocation_key, LABEL_RUNNER_TAG: runner_tag}
