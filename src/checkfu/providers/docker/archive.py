"""Archive transfers with the engine: reading paths out of a sandbox, writing archives in.

Reads use ``GET /containers/{id}/archive`` directly (on docker-py's session) so
the path's stat header can be checked before any body is read, and the
response closed at once when the path is not what the caller wants.

A path below something that is not a directory (``/etc/hostname/x``) holds
nothing; the engine refuses it with a bare 500, so on a 500 the nearest
existing ancestor is looked at (``HEAD``, its stat alone) rather than the
message read: when that ancestor is not a directory, the path is missing.

Confinement: the engine resolves every path of an archive request inside the
container's own root (it runs the tar chrooted to the container root since the
fix of CVE-2018-15664), and it archives the final component itself: a symlink
is returned as a link, never followed. So a read can reach only what is inside
the sandbox's file system view, whatever links the sandbox has planted.
"""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import dataclass
from typing import Any

from checkfu.contract.errors import SandboxProviderFailed
from checkfu.providers.docker.engine import STATUS_ERRORS

STAT_HEADER = "X-Docker-Container-Path-Stat"

GO_MODE_DIR = 1 << 31
GO_MODE_SYMLINK = 1 << 27
GO_MODE_TYPE = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
"""Go's ``os.ModeType``: directory, symlink, device, named pipe, socket, char device, irregular."""


@dataclass(frozen=True)
class PathStat:
    name: str
    size: int
    mode: int

    @property
    def is_dir(self) -> bool:
        return bool(self.mode & GO_MODE_DIR)

    @property
    def is_symlink(self) -> bool:
        return bool(self.mode & GO_MODE_SYMLINK)

    @property
    def is_regular(self) -> bool:
        return not self.mode & GO_MODE_TYPE


def _stat(response: Any) -> PathStat:
    raw = response.headers.get(STAT_HEADER, "")
    try:
        value = json.loads(base64.b64decode(raw))
        return PathStat(
            name=str(value["name"]),
            size=int(value["size"]),
            mode=int(value["mode"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxProviderFailed("archive: the engine sent no readable path stat") from exc


def _below_a_non_directory(api: Any, url: str, path: str) -> bool:
    """Whether the nearest existing ancestor of ``path`` is not a directory (a file, a device, or a link
    the engine could not descend through), so nothing can exist at ``path``."""
    parent = posixpath.dirname(path)
    while True:
        head = api.head(url, params={"path": parent}, timeout=api.timeout)
        head.close()
        if head.status_code == 200:
            stat = _stat(head)
            return stat.is_symlink or not stat.is_dir
        if head.status_code != 404 or parent == "/":
            return False
        parent = posixpath.dirname(parent)


def exists(api: Any, container: str, path: str) -> bool:
    """Whether anything (a link included, not followed) is at ``path`` in the container: its stat alone is asked."""
    url = f"{api.base_url}/v{api.api_version}/containers/{container}/archive"
    head = api.head(url, params={"path": path}, timeout=api.timeout)
    head.close()
    return bool(head.status_code == 200)


def open_path(api: Any, container: str, path: str) -> tuple[PathStat, Any] | None:
    """The stat of ``path`` and the open response streaming its archive, or ``None`` when nothing is there
    (``path`` does not exist, or lies below something that is not a directory).

    The caller must close the response.

    Raises:
        SandboxStateConflict: the engine refused with 409.
        SandboxProviderFailed: any other refusal.
    """
    url = f"{api.base_url}/v{api.api_version}/containers/{container}/archive"
    response = api.get(
        url, params={"path": path}, headers={"Accept-Encoding": "identity"}, stream=True, timeout=api.timeout
    )
    status = response.status_code
    if status != 200:
        response.close()
        if status == 404 or (status == 500 and _below_a_non_directory(api, url, path)):
            return None
        cls = STATUS_ERRORS.get(status, SandboxProviderFailed)
        raise cls(f"archive of {path!r}: engine answered {status}")
    try:
        return _stat(response), response
    except BaseException:
        response.close()
        raise
