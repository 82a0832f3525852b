"""The grade card: what a provider really is, for the people who choose it.

For one adapter it says which tier of the seed's table the envelope reaches (for a
third party, Docker parity also needs provider snapshot custody; the in-tree Docker
tier is the reference parity is measured against), each axis with its authority,
whether that counts as enforcement and what the ceiling allows, the egress grade
(an ``allowlist`` at ``unsupported`` is an uncertified allowlist), the conformance
tally recorded at enrollment with each skip's reason, each optional member and
lifecycle assurance the envelope declares with whether that conformance exercised it
(held or failed, in which case; or not exercised, and why), the provider faults
recorded in the journal, and a plain warning for each thing a weak tier does not do.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

from checkfu.conformance.cases import CASES, ITEMS, NOT_EXERCISED, declared, declared_by
from checkfu.contract.ceiling import THIRD_PARTY, RunnerProviderCapability, overreach
from checkfu.contract.codec import digest
from checkfu.contract.enforcement import AXES, counts_as_enforcement
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.ports import PortPublisher
from checkfu.contract.tiers import TIER_LABELS, TierName, assess
from checkfu.core.journal import EnrollmentRow, EventRow
from checkfu.core.registry import Adapter

AXIS_WORDS = {
    "sandbox_isolation": "the sandbox is a machine of its own (namespaces or a VM)",
    "root_read_only": "the root file system is read-only",
    "non_root": "processes do not run as root",
    "no_new_privileges": "no process gains privileges (setuid)",
    "capabilities_dropped": "Linux capabilities are dropped",
    "mounts_sealed": "staged mounts are sealed read-only",
    "disk_limit": "writable disk is bounded",
    "network_policy": "the network policy holds",
    "resource_limits": "CPU, memory and process limits hold",
}
"""What each axis means when it is enforced."""

AXIS_RISKS = {
    "sandbox_isolation": "work may run in the host's own namespaces",
    "root_read_only": "the root file system may be written",
    "non_root": "processes may run as root",
    "no_new_privileges": "a process may gain privileges (setuid)",
    "capabilities_dropped": "processes may hold Linux capabilities",
    "mounts_sealed": "the workload may change its staged mounts",
    "disk_limit": "writable disk is unbounded",
    "network_policy": "the network policy may not hold",
    "resource_limits": "CPU, memory and process counts are unbounded",
}
"""What a person should expect when an axis is not enforced."""


@dataclass
class GradeCard:
    target: str
    envelope_digest: str
    in_tree: bool
    tier: TierName
    short_of_next: list[str]
    axes: dict[str, dict[str, Any]]
    egress_certification: str
    uncertified_allowlist: bool
    ceiling: dict[str, Any]
    over_ceiling: list[str]
    conformance: dict[str, Any]
    enrollment: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    declared: list[dict[str, Any]] = field(default_factory=list)
    """Each optional member and lifecycle assurance the envelope declares, and what conformance made of it."""
    ports: str | None = None
    """What publishing a port (``-p``) opens, when the provider can publish (``PortPublisher``); ``None``: it
    cannot, and ``-p`` is refused on it."""

    @property
    def loud(self) -> bool:
        """Below day one, an axis not enforced, or a claim above the ceiling: the card says so on its face."""
        return (
            self.tier == "below_day_one" or not all(a["counts"] for a in self.axes.values()) or bool(self.over_ceiling)
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "envelope_digest": self.envelope_digest,
            "in_tree": self.in_tree,
            "tier": self.tier,
            "tier_label": TIER_LABELS[self.tier],
            "short_of_next": self.short_of_next,
            "axes": self.axes,
            "egress_certification": self.egress_certification,
            "uncertified_allowlist": self.uncertified_allowlist,
            "ceiling": self.ceiling,
            "over_ceiling": self.over_ceiling,
            "conformance": self.conformance,
            "enrollment": self.enrollment,
            "warnings": self.warnings,
            "loud": self.loud,
            "history": self.history,
            "declared": self.declared,
            "ports": self.ports,
        }


def _warnings(env: SandboxProviderCapabilities, tier: TierName, uncertified: bool, over: list[str]) -> list[str]:
    out: list[str] = []
    for claim in over:
        out.append(f"claims more than the ceiling allows: {claim}")
    if tier == "below_day_one":
        out.append("below the day-one tier: not a confinement to run untrusted work in")
    for axis, authority in env.enforcement.items():
        if not counts_as_enforcement(authority):
            out.append(f"{axis} is {authority}, not enforced: {AXIS_RISKS[axis]}")
    if "unrestricted" in env.network_modes:
        out.append("serves 'unrestricted' network: a Run on it can reach anything its host can")
    if uncertified:
        out.append("its allowlist egress is uncertified (egress_certification 'unsupported')")
    if "durable" in env.retention_modes and not env.lifecycle_assurances.release_destroys:
        out.append("release does not destroy: what a Run wrote may survive it")
    if not env.user_namespace:
        out.append("no user namespace per sandbox: uid 0 inside would be uid 0 on the host")
    return out


def exercised(env: SandboxProviderCapabilities, recorded: dict[str, Any], *, current: bool) -> list[dict[str, Any]]:
    """Each optional member and lifecycle assurance ``env`` declares, and whether the recorded conformance
    exercised it: ``held`` or ``failed`` in the case that did (from that case's ``exercised`` and ``faulted``),
    else ``not exercised``, with why. Only a record of this very envelope counts."""
    cases = [c for c in recorded.get("cases") or [] if isinstance(c, dict)]
    says = any(isinstance(c.get("exercised"), list) for c in cases)
    out: list[dict[str, Any]] = []
    for item in ITEMS:
        if not declared(env, item):
            continue
        row: dict[str, Any] = {
            "item": item,
            "kind": "assurance" if declared_by(item).startswith("lifecycle_assurances") else "operation",
            "declared_by": declared_by(item),
            "exercised": "not exercised",
            "case": None,
            "why": "",
        }
        failed = [c for c in cases if item in _strings(c.get("faulted"))]
        held = [c for c in cases if item in _strings(c.get("exercised"))]
        if not cases:
            row["why"] = "no conformance recorded (checkfu provider test runs it; enrollment records it)"
        elif not current:
            row["why"] = "the recorded conformance is of another envelope"
        elif not says:
            suite = recorded.get("suite_version") or "an older suite"
            row["why"] = f"recorded by {suite}, which does not say what it exercised"
        elif failed:
            row.update(exercised="failed", case=failed[0].get("number"), why=str(failed[0].get("reason", "")))
        elif held:
            row.update(exercised="held", case=held[0].get("number"))
        else:
            row["why"] = _why_not(item, cases, env)
        out.append(row)
    return out


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _why_not(item: str, cases: list[dict[str, Any]], env: SandboxProviderCapabilities) -> str:
    """Why a declared item went unexercised in a record that says what it exercised."""
    if item in NOT_EXERCISED:
        return NOT_EXERCISED[item]
    if item == "reaps_process_tree" and not env.declares("openProcess"):
        return "needs openProcess, to watch a process across release"
    owners = [case.number for case in CASES if item in case.items]
    for c in cases:
        if c.get("number") in owners and c.get("outcome") == "skip":
            return f"case {c.get('number')} was skipped: {c.get('reason', '')}"
    return "no recorded case exercised it"


PORTS_OPEN = (
    "-p publishes a sandbox port on this machine: one listening address per port, 127.0.0.1 unless -p names "
    "another (0.0.0.0 only when asked, with a warning), leading to 127.0.0.1:PORT inside the sandbox and nothing "
    "else; the sandbox's network is unchanged (none keeps only lo) and the port closes with the sandbox"
)


def grade(
    adapter: Adapter,
    *,
    enrollment: EnrollmentRow | None = None,
    history: list[EventRow] | None = None,
    conformance: dict[str, Any] | None = None,
) -> GradeCard:
    """The grade card of ``adapter``; ``conformance`` (a report's JSON) wins over the enrollment's record."""
    card = grade_envelope(
        adapter.envelope,
        in_tree=adapter.in_tree,
        ceiling=adapter.ceiling,
        enrollment=enrollment,
        history=history,
        conformance=conformance,
    )
    if isinstance(adapter.provider, PortPublisher):
        card.ports = PORTS_OPEN
    return card


def grade_envelope(
    env: SandboxProviderCapabilities,
    *,
    in_tree: bool = False,
    ceiling: RunnerProviderCapability = THIRD_PARTY,
    enrollment: EnrollmentRow | None = None,
    history: list[EventRow] | None = None,
    conformance: dict[str, Any] | None = None,
) -> GradeCard:
    """The grade card of an envelope, as a third party's unless ``in_tree`` (with its ceiling) says otherwise."""
    graded = assess(env, in_tree=in_tree)
    axes: dict[str, dict[str, Any]] = {
        axis: {
            "authority": env.enforcement.authority(axis),
            "counts": counts_as_enforcement(env.enforcement.authority(axis)),
            "ceiling": ceiling.enforcement.authority(axis),
        }
        for axis in AXES
    }
    over = [str(o) for o in overreach(env, ceiling)]
    uncertified = "allowlist" in env.network_modes and env.egress_certification == "unsupported"
    if conformance is not None:
        recorded = {"source": "run now", **conformance}
        current = conformance.get("envelope_digest", digest(env)) == digest(env)
    elif enrollment is not None and enrollment.evidence is not None:
        recorded = {"source": "enrollment evidence", **enrollment.evidence}
        current = enrollment.envelope_digest == digest(env)
    else:
        recorded = {"source": "none recorded", "tally": None, "cases": []}
        current = False
    return GradeCard(
        target=str(env.target),
        envelope_digest=digest(env),
        in_tree=in_tree,
        tier=graded.tier,
        short_of_next=list(graded.short_of_next),
        axes=axes,
        egress_certification=env.egress_certification,
        uncertified_allowlist=uncertified,
        ceiling=json.loads(ceiling.model_dump_json()),
        over_ceiling=over,
        conformance=recorded,
        enrollment=None
        if enrollment is None
        else {
            "kind": enrollment.kind,
            "source": enrollment.source,
            "envelope_digest": enrollment.envelope_digest,
            "current": enrollment.envelope_digest == digest(env),
            "enrolled_at": enrollment.enrolled_at,
        },
        warnings=_warnings(env, graded.tier, uncertified, over),
        history=[
            {
                "member": e.member,
                "run_id": e.run_id,
                "started_at": e.started_at,
                "error_code": e.error_code,
                "detail": e.detail,
            }
            for e in history or []
        ],
        declared=exercised(env, recorded, current=current),
    )


def render_text(card: GradeCard) -> list[str]:
    """The card as lines for a terminal (plain text; the caller escapes nothing, it holds no markup)."""
    lines = [
        f"provider   {card.target}{' (in-tree)' if card.in_tree else ''}",
        f"tier       {TIER_LABELS[card.tier]}"
        + (f" (short of the next: {'; '.join(card.short_of_next)})" if card.short_of_next else ""),
        "axes",
    ]
    for axis, a in card.axes.items():
        mark = "enforced" if a["counts"] else "NOT ENFORCED"
        lines.append(f"  {axis:<22} {a['authority']:<18} {mark:<13} ceiling {a['ceiling']}")
    egress = card.egress_certification + (" (an uncertified allowlist)" if card.uncertified_allowlist else "")
    lines.append(f"egress     {egress}; ceiling {card.ceiling['egress_certification']}")
    lines.append(f"ports      {card.ports or 'cannot publish a port (-p is refused)'}")
    conf = card.conformance
    if conf.get("tally"):
        t = conf["tally"]
        lines.append(
            f"conformance {t.get('pass', 0)} passed, {t.get('fail', 0)} failed, {t.get('skip', 0)} skipped "
            f"({conf['source']})"
        )
        for c in conf.get("cases", []):
            if c.get("outcome") != "pass":
                lines.append(f"  case {c.get('number')} {c.get('outcome')}: {c.get('reason')}")
    else:
        lines.append("conformance none recorded (checkfu provider test; enrollment records it)")
    lines.append("declared   (optional members and lifecycle assurances; what conformance exercised)")
    for d in card.declared:
        if d["exercised"] == "not exercised":
            verdict = f"not exercised: {d['why']}"
        else:
            verdict = f"exercised in case {d['case']}: " + (
                "held" if d["exercised"] == "held" else f"FAILED: {d['why']}"
            )
        lines.append(f"  {d['item']:<22} {d['declared_by']:<44} {verdict}"[:400])
    if not card.declared:
        lines.append("  nothing beyond the nine required members")
    for w in card.warnings:
        lines.append(f"warning    {w}")
    for h in card.history[:10]:
        lines.append(f"fault      {h['member']} {h['error_code']}: {(h['detail'] or '')[:120]} (run {h['run_id']})")
    return lines


def render_html(card: GradeCard) -> str:
    """One self-contained page: no script, no external asset."""
    e = html.escape
    rows = "".join(
        f"<tr class='{'ok' if a['counts'] else 'weak'}'><td>{e(axis)}</td><td>{e(a['authority'])}</td>"
        f"<td>{'enforced' if a['counts'] else 'not enforced'}</td><td>{e(a['ceiling'])}</td>"
        f"<td>{e(AXIS_WORDS[axis])}</td></tr>"
        for axis, a in card.axes.items()
    )
    warnings = "".join(f"<li>{e(w)}</li>" for w in card.warnings) or "<li>none</li>"
    conf = card.conformance
    tally = conf.get("tally")
    cases = "".join(
        f"<tr class='{e(str(c.get('outcome')))}'><td>{e(str(c.get('number')))}</td><td>{e(str(c.get('name')))}</td>"
        f"<td>{e(str(c.get('outcome')))}</td><td>{e(str(c.get('reason', '')))}</td></tr>"
        for c in conf.get("cases", [])
    )
    declared_rows = (
        "".join(
            f"<tr class='{e(d['exercised'].replace(' ', '-'))}'><td>{e(d['item'])}</td><td>{e(d['declared_by'])}</td>"
            f"<td>{e(d['exercised'])}</td><td>{e(str(d['case'] or ''))}</td><td>{e(d['why'])}</td></tr>"
            for d in card.declared
        )
        or "<tr><td colspan='5'>nothing beyond the nine required members</td></tr>"
    )
    history = (
        "".join(
            f"<tr><td>{e(h['member'])}</td><td>{e(str(h['error_code']))}</td><td>{e(str(h['detail'] or ''))}</td>"
            f"<td>{e(h['run_id'])}</td></tr>"
            for h in card.history
        )
        or "<tr><td colspan='4'>no provider fault recorded</td></tr>"
    )
    egress = e(card.egress_certification) + (" &mdash; an uncertified allowlist" if card.uncertified_allowlist else "")
    conformance = (
        f"{tally.get('pass', 0)} passed, {tally.get('fail', 0)} failed, {tally.get('skip', 0)} skipped "
        f"({e(conf['source'])})"
        if tally
        else "none recorded"
    )
    loud = " loud" if card.loud else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>grade card: {e(card.target)}</title>
<style>
body{{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:60rem;color:#1b1b1b}}
h1{{font-size:1.35rem}} table{{border-collapse:collapse;width:100%;margin:.5rem 0 1.5rem}}
td,th{{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}}
tr.weak td,tr.fail td,tr.failed td{{background:#fde2e2}} tr.ok td,tr.pass td,tr.held td{{background:#e6f4e6}}
tr.skip td,tr.not-exercised td{{background:#fff6d6}}
.tier{{font-size:1.2rem;font-weight:600}} .loud .tier{{color:#a40000}}
ul.warnings li{{color:#a40000}}
</style></head>
<body class="card{loud}">
<h1>Grade card: {e(card.target)}{" (in-tree)" if card.in_tree else ""}</h1>
<p class="tier" id="tier" data-tier="{e(card.tier)}">{e(TIER_LABELS[card.tier])}</p>
<p>{("Short of the next tier: " + e("; ".join(card.short_of_next))) if card.short_of_next else "The top tier."}</p>
<p>Envelope {e(card.envelope_digest)}</p>
<h2>Enforcement, axis by axis</h2>
<table id="axes"><tr><th>axis</th><th>authority</th><th>counts</th><th>ceiling allows</th><th>what it means</th></tr>
{rows}</table>
<h2>Egress</h2><p id="egress">{egress}; the ceiling allows {e(card.ceiling["egress_certification"])}</p>
<h2>Ports</h2><p id="ports">{e(card.ports or "cannot publish a port (-p is refused)")}</p>
<h2>Conformance</h2><p id="conformance">{conformance}</p>
{f'<table id="cases"><tr><th>#</th><th>case</th><th>outcome</th><th>reason</th></tr>{cases}</table>' if cases else ""}
<h2>Declared, and exercised by conformance</h2>
<table id="declared"><tr><th>optional member or assurance</th><th>declared by</th><th>conformance</th><th>case</th>
<th>why</th></tr>{declared_rows}</table>
<h2>Warnings</h2><ul class="warnings" id="warnings">{warnings}</ul>
<h2>Provider faults recorded</h2>
<table id="history"><tr><th>member</th><th>code</th><th>detail</th><th>run</th></tr>{history}</table>
</body></html>
"""
