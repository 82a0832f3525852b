"""``checkfu images prune`` and the journal-opening sweep of expired snapshots, on the real engine.

One runner tag of the test's own: the images it labels are the only ones counted, and an image under
another tag (made by the test too) must come through untouched.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_kit import LEASE, leftovers, resources
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.contract.members import CompensateRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.providers.docker import DockerProvider
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.envelope import host_facts

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def own_tag(provider: DockerProvider, client: Any) -> Iterator[str]:
    """This test's runner tag; whatever is left under it (or under its foreign twin) is reclaimed, and fails it."""
    own = "tp" + uuid.uuid4().hex[:12]
    yield own
    left = leftovers(client, own) + leftovers(client, own + "-foreign")
    for image in client.images.list(filters={"label": f"{L.RUNNER_TAG}={own}-foreign"}):
        client.images.remove(image.id, force=True)
    for key in sorted({k for _, _, k in left}):
        asyncio.run(
            provider.compensate(
                CompensateRequest(target=provider.target, lease=LEASE, allocation_key=key, runner_tag=own)
            )
        )
    for image in client.images.list(filters={"label": f"{L.RUNNER_TAG}={own}"}):
        client.images.remove(image.id, force=True)
    assert left == []


def built(client: Any, base: str, tag: str, kind: str, key: str) -> str:
    """An image built from ``base`` with one layer of its own, labelled as the Docker tier labels what it builds."""
    dockerfile = (
        f"FROM {base}\nRUN echo {uuid.uuid4().hex} > /marker\n"
        f'LABEL {L.RUNNER_TAG}="{tag}" {L.KIND}="{kind}" {L.ALLOCATION_KEY}="{key}"\n'
    )
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True, pull=False)
    return str(image.id)


async def prune(tmp_path: Path, url: str, tag: str, *args: str) -> Any:
    """The command, in a thread of its own (as from a shell: no event loop is running there)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "CHECKFU_RUNNER_TAG": tag}
    return await asyncio.to_thread(CliRunner().invoke, app, ["images", "prune", "--db", url, *args], env=env)


def own_images(client: Any, tag: str) -> set[str]:
    return {i.id for i in client.images.list(filters={"label": f"{L.RUNNER_TAG}={tag}"})}


async def test_images_prune_removes_only_what_nothing_refers_to(
    provider: DockerProvider, client: Any, busybox_id: str, own_tag: str, tmp_path: Path
) -> None:
    envelope = (await provider.describe()).envelope
    registry = Registry()
    registry.add(Adapter(envelope=envelope, provider=provider, source="entry point docker", in_tree=True))
    url = sqlite_url(tmp_path / "journal.sqlite")
    journal = Journal(url)
    profile = SandboxProfile(
        tier="container",
        base_image=busybox_id,
        network_policy={"mode": "none"},
        resource_limits=resources(),
        retention_mode="durable",
    )
    platform = Platform(os="linux", architecture=host_facts().architecture)
    root = built(client, busybox_id, own_tag, "image", "materialize-root")  # a kept snapshot's sandbox ran it
    running = built(client, busybox_id, own_tag, "image", "materialize-running")  # a live sandbox runs it
    unused = built(client, busybox_id, own_tag, "image", "materialize-unused")
    foreign = built(client, busybox_id, own_tag + "-foreign", "image", "materialize-foreign")
    try:
        runner = Runner(registry, journal, runner_tag=own_tag, clock=SystemClock())
        attempt = runner.start(envelope.target, profile, platform=platform)
        s = attempt.session
        inst = await s.provision(profile, platform, root)
        await s.activate(inst)
        kept = await s.snapshot(inst)  # no lifetime: the journal keeps it, and it names `root`
        expiring = await s.snapshot(inst, keep_seconds=3)
        stale = await s.snapshot(inst)
        await s.release(inst)
        journal.set_allocation(stale.allocation_key, "released", now=time.time())  # its record no longer needs it
        live = await s.provision(profile, platform, running)
        await s.activate(live)
        assert client.images.get(kept.snapshot_id).labels[L.ROOT_IMAGE] == root

        # The expired snapshot is deleted by the next command that opens the journal (runner custody).
        assert expiring.expires_at is not None
        time.sleep(max(0.0, expiring.expires_at - time.time()) + 0.2)
        before = own_images(client, own_tag)
        dry = await prune(tmp_path, url, own_tag, "--dry-run", "--json")
        assert dry.exit_code == 0, dry.output
        assert "deleted 1 expired snapshot(s)" in dry.stderr
        row = journal.allocation(expiring.allocation_key)
        assert row is not None and row.state == "released"
        assert expiring.snapshot_id not in own_images(client, own_tag)
        report = json.loads(dry.stdout)
        actions = {i["id"]: (i["action"], i["reason"]) for i in report["images"]}
        assert {i for i, (a, _) in actions.items() if a == "would_remove"} == {unused, stale.snapshot_id}
        assert actions[root][0] == "kept" and kept.allocation_key in actions[root][1]
        assert actions[running][0] == "kept" and "runs it" in actions[running][1]
        assert actions[kept.snapshot_id][0] == "kept"
        assert foreign not in actions and report["runner_tags"] == [own_tag]
        assert report["reclaimable_bytes"] > 0 and report["reclaimed_bytes"] == 0
        assert own_images(client, own_tag) == before - {expiring.snapshot_id}  # the dry run removed nothing

        done = await prune(tmp_path, url, own_tag, "--json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        assert {i["id"] for i in report["images"] if i["action"] == "removed"} == {unused, stale.snapshot_id}
        assert report["reclaimed_bytes"] == sum(i["bytes"] for i in report["images"] if i["action"] == "removed") > 0
        assert own_images(client, own_tag) == {root, running, kept.snapshot_id}
        assert client.images.get(foreign)  # another tag's image is never touched

        said = await prune(tmp_path, url, own_tag)  # the summary a person reads
        assert said.exit_code == 0 and "removed 0 image(s), reclaimed 0 B; 3 kept" in " ".join(said.stderr.split())

        await s.release(live)
        await s.delete_snapshot(kept)
        runner.finish(attempt, status="succeeded", exit_code=0)
        last = json.loads((await prune(tmp_path, url, own_tag, "--json")).stdout)  # nothing refers to them any more
        assert {i["id"] for i in last["images"] if i["action"] == "removed"} == {root, running}
        assert leftovers(client, own_tag) == []
    finally:
        journal.close()
        client.images.remove(foreign, force=True)
