"""Pinning a base image named by tag to the engine's image id, before a profile is admitted.

A profile names its base image by digest or by a locally built image id, never by
a tag that can move (the profile's digest would not say what ran). A person names
``checkfu/debian:12``; this turns it into the id the engine holds under that tag
now. Nothing is pulled: the image must be on the local engine already.
"""

from __future__ import annotations

import json
import urllib.parse

import docker
import docker.errors
import requests.exceptions

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxProfileInvalid
from checkfu.providers.docker.engine import Early, local_client, require_engine

REFUSED_REFERENCE = frozenset({400, 404})
"""Engine statuses meaning the reference names no image here (404) or no image at all (400)."""


def ask_pin_early(ref: str) -> Early | None:
    """``pin_base_image``'s question about ``ref``, sent now to be answered while the caller does other work;
    None when ``ref`` needs no question or it cannot be sent that way (``pin_base_image`` then asks itself)."""
    if "sha256:" in ref:
        return None
    return Early.ask(f"/images/{urllib.parse.quote(ref, safe='/:@')}/json")


def pin_base_image(ref: str, early: Early | None = None) -> str:
    """The engine's image id (``sha256:...``) for the image ``ref`` names; ``ref`` itself when it is pinned
    already (it holds ``sha256:``, as an id or a digest reference does). ``early``: the question
    ``ask_pin_early(ref)`` sent; any answer but the image or its absence is asked again, through docker-py.

    Raises:
        SandboxProfileInvalid: the engine has no image ``ref`` (field ``base_image``).
        SandboxAdapterUnavailable: no Docker Engine answers (field ``provider``).
    """
    if "sha256:" in ref:
        return ref
    if early is not None:
        try:
            status, _, body = early.answer()
            image_id = json.loads(body).get("Id") if status == 200 else None
        except (OSError, ValueError, AttributeError):
            status, image_id = 0, None
        if isinstance(image_id, str) and image_id.startswith("sha256:"):
            return image_id
        if status in REFUSED_REFERENCE:
            raise _no_image(ref)
    require_engine()
    try:
        client = local_client()
    except docker.errors.DockerException as exc:
        raise _no_engine(exc) from None
    try:
        return str(client.api.inspect_image(ref)["Id"])
    except docker.errors.APIError as exc:
        if exc.status_code in REFUSED_REFERENCE:
            raise _no_image(ref) from None
        raise _no_engine(exc) from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise _no_engine(exc) from None
    finally:
        client.close()


def _no_image(ref: str) -> SandboxProfileInvalid:
    return SandboxProfileInvalid(
        f"base_image: the Docker engine has no image {ref!r}, and nothing is pulled "
        "(scripts/base-images builds checkfu/busybox:1 and checkfu/debian:12)",
        field="base_image",
    )


def _no_engine(exc: Exception) -> SandboxAdapterUnavailable:
    return SandboxAdapterUnavailable(
        f"the Docker tier is not available: the engine cannot be asked ({type(exc).__name__}: {str(exc)[:300]})",
        field="provider",
    )
