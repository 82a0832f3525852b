"""The grade card: correct for the in-tree tiers, loud for the weak one, and a page a real browser renders."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checkfu.contract.enforcement import AXES
from checkfu.contract.errors import SandboxLeaseFenced, SandboxResultInvalid
from checkfu.contract.vocabulary import Platform
from checkfu.control.grading import grade, grade_envelope, render_text
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.core.sandboxes import SandboxHost
from checkfu.testing import MemoryProvider, day_one_envelope, memory_profile
from checkfu.testing.misbehave import Misbehaving, release_keeps

CHECKFU = Path(sys.executable).with_name("checkfu")
CHROMIUM = shutil.which("chromium")

pytestmark = pytest.mark.anyio


def card_json(*args: str, cwd: Path) -> dict[str, object]:
    done = subprocess.run(
        [str(CHECKFU), "provider", "grade", *args, "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(cwd / "state")},
    )
    assert done.returncode == 0, done.stderr
    body: dict[str, object] = json.loads(done.stdout)
    return body


@pytest.mark.docker
def test_the_docker_tiers_card_shows_nine_enforced_axes(tmp_path: Path) -> None:
    card = card_json("docker", cwd=tmp_path)
    axes = card["axes"]
    assert isinstance(axes, dict) and set(axes) == set(AXES)
    assert all(a["authority"] == "runner_enforced" and a["counts"] for a in axes.values())
    # allowlist egress (issue 15) is what lifted it from durable: the top tier, nothing short of a next one
    assert card["tier"] == "docker_parity" and card["short_of_next"] == []
    assert card["egress_certification"] == "advisory_filter"
    assert card["in_tree"] is True and card["loud"] is False
    assert set(card) >= {"tier", "axes", "egress_certification", "ceiling", "conformance"}


def test_the_host_process_tiers_card_is_loud(tmp_path: Path) -> None:
    card = card_json("host-process", cwd=tmp_path)
    assert card["tier"] == "below_day_one" and card["loud"] is True
    warnings = card["warnings"]
    assert isinstance(warnings, list)
    assert any("below the day-one tier" in w for w in warnings)
    assert any("'unrestricted' network" in w for w in warnings)
    assert any(w.startswith("sandbox_isolation is not_enforced") for w in warnings)
    axes = card["axes"]
    assert isinstance(axes, dict) and not axes["sandbox_isolation"]["counts"]


def test_parity_for_a_third_party_needs_provider_snapshot_custody() -> None:
    parity = {
        "operations": ("openProcess", "readFiles", "listAllocations"),
        "network_modes": ("none", "allowlist"),
        "egress_certification": "advisory_filter",
    }
    runner_custody = grade_envelope(MemoryProvider().envelope.model_copy(update=parity))
    assert runner_custody.tier == "durable" and runner_custody.short_of_next == ["provider snapshot custody"]
    provider_custody = grade_envelope(
        MemoryProvider().envelope.model_copy(update={**parity, "snapshot_custody": "provider"})
    )
    assert provider_custody.tier == "docker_parity"


def test_an_allowlist_at_unsupported_is_shown_uncertified() -> None:
    env = day_one_envelope().model_copy(update={"network_modes": ("none", "allowlist")})
    card = grade_envelope(env)
    assert card.uncertified_allowlist and any("uncertified" in w for w in card.warnings)


async def test_a_broken_release_promise_is_a_fault_on_the_cards_history(tmp_path: Path) -> None:
    memory = MemoryProvider()
    double = Misbehaving(memory, {"release": release_keeps})
    adapter = Adapter(envelope=memory.envelope, provider=double, source="broken promise")
    registry = Registry()
    registry.add(adapter)
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        runner = Runner(registry, journal, runner_tag="grade-card", clock=ManualClock())
        profile, amd64 = memory_profile(), Platform(os="linux", architecture="amd64")
        session = runner.start(adapter.target, profile, platform=amd64).session
        image = (await session.materialize(profile, amd64)).image
        inst = await session.provision(profile, amd64, image)
        await session.activate(inst)
        with pytest.raises(SandboxResultInvalid) as caught:
            await session.release(inst)
        assert caught.value.field == "destroyed" and "release_destroys" in caught.value.message
        row = journal.allocation(inst.allocation_key)
        assert row is not None and row.state == "compensated" and memory.live_objects() == ()
        card = grade(adapter, history=journal.provider_faults(adapter.target))
    finally:
        journal.close()
    (fault,) = card.history
    assert (fault["member"], fault["error_code"]) == ("release", "SandboxResultInvalid")


async def test_a_sandbox_past_its_own_time_to_live_is_no_fault_on_the_cards_history(tmp_path: Path) -> None:
    memory = MemoryProvider()
    adapter = Adapter(envelope=memory.envelope, provider=memory, source="memory")
    registry = Registry()
    registry.add(adapter)
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    try:
        host = SandboxHost(registry, journal, runner_tag="grade-card", clock=clock)
        made = await host.create(
            adapter.target, memory_profile(), Platform(os="linux", architecture="amd64"), ttl=60, detached=True
        )
        clock.advance(120)  # the user's own time-to-live passes
        with pytest.raises(SandboxLeaseFenced) as caught:
            await made.exec(["true"])
        assert caught.value.field == "ttl"
        # The Run's history keeps the refusal; the provider's record does not count it against the provider.
        history = journal.events_for_run(made.record.run_id)
        assert [e.error_code for e in history if e.outcome == "error"] == ["SandboxLeaseFenced"]
        card = grade(adapter, history=journal.provider_faults(adapter.target))
        await made.release()  # reclaimed as the next command would: nothing is left in the provider
        assert memory.live_objects() == ()
    finally:
        journal.close()
    assert card.history == []
    assert not any(line.startswith("fault") for line in render_text(card))


@pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CHECKFU_REQUIRE_CHROMIUM") != "1",
    reason="no Chromium (scripts/setup installs it)",
)
def test_the_html_card_in_a_real_headless_browser(tmp_path: Path) -> None:
    page = tmp_path / "card.html"
    done = subprocess.run(
        [str(CHECKFU), "provider", "grade", "host-process", "--html", str(page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert done.returncode == 0, done.stderr
    assert "<script" not in page.read_text() and "http" not in page.read_text().split("<body")[1]
    dom = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'class="card loud"' in html
    assert re.search(r'id="tier" data-tier="below_day_one">below the day-one tier<', html)
    assert html.count('<tr class="weak">') == 8 and html.count('<tr class="ok">') == 1  # resource_limits counts
    assert "serves 'unrestricted' network" in html
