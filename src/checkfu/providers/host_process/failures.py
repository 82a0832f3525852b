"""Foreign errors to the contract's vocabulary, by type through one table, never by their text."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from contextlib import contextmanager

from checkfu.contract.errors import SandboxError, SandboxProviderFailed

FOREIGN_ERRORS: tuple[tuple[type[BaseException], bool], ...] = (
    (tarfile.TarError, False),
    (PermissionError, False),
    (BlockingIOError, True),
    (RecursionError, False),
    (OSError, True),
)
"""Each foreign type the provider meets at the seam, first match wins, and whether retrying may help.
Every one becomes ``SandboxProviderFailed``: none of them is the caller's fault. Anything else
becomes ``SandboxProviderFailed`` too, retryable."""


def translate(exc: BaseException, doing: str) -> SandboxError:
    """The vocabulary member a foreign error raised while ``doing`` amounts to."""
    retryable = True
    for kind, may_retry in FOREIGN_ERRORS:
        if isinstance(exc, kind):
            retryable = may_retry
            break
    return SandboxProviderFailed(f"{doing}: {type(exc).__name__}: {exc}", retryable=retryable)


@contextmanager
def seam(doing: str) -> Iterator[None]:
    """Let vocabulary errors through; translate every other ``Exception`` raised in the block.

    Raises:
        SandboxProviderFailed: for any foreign error.
    """
    try:
        yield
    except SandboxError:
        raise
    except Exception as exc:
        raise translate(exc, doing) from exc
