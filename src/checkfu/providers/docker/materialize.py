"""``materialize``: the image a profile becomes, built once per materialization digest.

The digest covers exactly what changes the image: the base image, the pinned
packages of each manager and ``materialization_revision``. A built image is
labelled with it (``checkfu.materialization_digest``) and found again by that
label, so a second call is a cache hit (``built: false``). A profile without
packages materializes to its base image itself.

The Dockerfile starts ``FROM`` the pinned base image, installs as root with the
host's network (so the package registries are reachable) and, for pip, the
host's CA bundle, then ends with ``USER`` the sandbox user. The base image must
be on this engine already: nothing is ever pulled. A build says first, as its
first line of output, that it reaches the network and for which packages: the
profile's ``network_policy`` binds the sandbox, never its image's build. An
operator forbids such builds with ``CHECKFU_BUILD_NETWORK=none``, which the
runner enforces at admission (``checkfu.core.admission``), before any build.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import rfc8785

from checkfu.contract.errors import SandboxNotFound, SandboxProviderFailed
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.spec import SandboxUser

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_IN_IMAGE = "/usr/local/share/checkfu/host-ca.crt"

BuildLine = Callable[[str], None]
"""Called with each line of an image build's output, without its line end."""


def materialization_digest(profile: SandboxProfile, revision: str) -> str:
    """``sha256:`` over the base image, the sorted pins of each manager and the revision."""
    packages: dict[str, list[str]] = {m: sorted(names) for m, names in sorted(profile.packages.items()) if names}
    document: dict[str, str | dict[str, list[str]]] = {
        "base_image": profile.base_image,
        "packages": packages,
        "materialization_revision": revision,
    }
    return "sha256:" + hashlib.sha256(rfc8785.dumps(document)).hexdigest()


def cache_key(digest: str) -> str:
    """The allocation key a materialized image is labelled with."""
    return "materialize-" + digest.removeprefix("sha256:")


def dockerfile(profile: SandboxProfile, user: SandboxUser, *, with_ca: bool) -> str:
    """The Dockerfile for ``profile``: ``FROM`` its base image, its packages, then the sandbox user."""
    apt = list(profile.packages.get("apt", ()))
    pip = list(profile.packages.get("pip", ()))
    lines = [f"FROM {profile.base_image}", "USER 0:0"]
    if pip:
        apt.append("python3-pip")
    if apt:
        names = " ".join(shlex.quote(n) for n in apt)
        lines.append(
            "RUN apt-get update"
            f" && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {names}"
            " && apt-get clean && rm -rf /var/lib/apt/lists/*"
        )
    if pip:
        env = "PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1"
        if with_ca:
            lines.append(f"COPY host-ca.crt {CA_IN_IMAGE}")
            env += f" PIP_CERT={CA_IN_IMAGE}"
        names = " ".join(shlex.quote(n) for n in pip)
        lines.append(f"RUN {env} python3 -m pip install --no-input {names}")
    lines.append(f"USER {user.uid}:{user.gid}")
    return "\n".join(lines) + "\n"


def network_notice(profile: SandboxProfile) -> str:
    """The first line of a build's output: that it reaches the network, for which packages, and how to forbid it."""
    wanted = "; ".join(f"packages.{m}: {', '.join(names)}" for m, names in sorted(profile.packages.items()) if names)
    return (
        f"building the image for {wanted}: the build runs on the host's network to reach the package registries "
        "(the profile's network_policy binds the sandbox, not this build; CHECKFU_BUILD_NETWORK=none forbids it)"
    )


def _context(text: str, ca: bytes | None) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", text.encode()), ("host-ca.crt", ca)):
            if data is None:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


class Materializer:
    """Builds and finds materialized images. Blocking: run its methods in the engine's pool."""

    def __init__(self, api: Any, build_api: Callable[[], Any], user: SandboxUser, cache_tag: str) -> None:
        self._api = api
        self._build_api = build_api
        self._user = user
        self._cache_tag = cache_tag
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, digest: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(digest, threading.Lock())

    def base_image_id(self, ref: str) -> str:
        """The local id of the pinned base image.

        Raises:
            SandboxNotFound: the image is not on this engine (nothing is pulled).
        """
        try:
            return str(self._api.inspect_image(ref)["Id"])
        except Exception as exc:
            if getattr(exc, "status_code", None) == 404:
                raise SandboxNotFound(
                    f"profile.base_image: {ref[:90]} is not on this engine, and nothing is pulled",
                    field="profile.base_image",
                ) from exc
            raise

    def cached(self, digest: str) -> str | None:
        images = self._api.images(filters={"label": [f"{L.MATERIALIZATION}={digest}"]})
        return str(images[0]["Id"]) if images else None

    def materialize(self, profile: SandboxProfile, revision: str, emit: BuildLine | None) -> tuple[str, bool]:
        """The image id for ``profile`` and whether this call built it."""
        base = self.base_image_id(profile.base_image)
        if not profile.package_managers:
            return base, False
        digest = materialization_digest(profile, revision)
        with self._lock(digest):
            found = self.cached(digest)
            if found is not None:
                return found, False
            return self._build(profile, digest, emit), True

    def _build(self, profile: SandboxProfile, digest: str, emit: BuildLine | None) -> str:
        ca = HOST_CA_BUNDLE.read_bytes() if "pip" in profile.package_managers and HOST_CA_BUNDLE.exists() else None
        text = dockerfile(profile, self._user, with_ca=ca is not None)
        labels = L.object_labels(cache_key(digest), self._cache_tag, "image", **{L.MATERIALIZATION: digest})
        if emit is not None:
            emit(network_notice(profile))
        client = self._build_api()
        try:
            events: Iterable[dict[str, Any]] = client.build(
                fileobj=_context(text, ca),
                custom_context=True,
                network_mode="host",
                labels=labels,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
            )
            image: str | None = None
            for event in events:
                if "error" in event:
                    detail = event.get("errorDetail", {}).get("message") or event["error"]
                    raise SandboxProviderFailed(f"materialize: the build failed: {str(detail)[:500]}", retryable=False)
                aux = event.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                    image = aux["ID"]
                chunk = event.get("stream")
                if emit is not None and isinstance(chunk, str):
                    for line in chunk.splitlines():
                        if line.strip():
                            emit(line.rstrip())
        finally:
            client.close()
        if image is None:
            image = self.cached(digest)
        if image is None:
            raise SandboxProviderFailed("materialize: the build reported no image")
        return image
