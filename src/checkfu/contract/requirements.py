"""Whether an envelope can serve a profile and an attempt: the check selection runs
before any provider work. Pure; every unmet requirement is listed, not just the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, Unmet
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform


def unmet_requirements(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    *,
    platform: Platform,
    mount_count: int,
    terminal: bool = False,
    writable_mounts: bool = False,
    mount_symlinks: bool = False,
    interactive: bool = False,
    capture: bool = False,
    capture_dirs: Sequence[str] = (),
) -> list[Unmet]:
    """Every way ``envelope`` falls short of ``profile`` and the attempt, each naming its field.

    ``terminal``: the attempt gives its process a pseudo-terminal; ``writable_mounts``: a mount is
    writable; ``mount_symlinks``: a mount holds a symlink; ``capture``: files are read back after the
    command (``readFiles``); ``capture_dirs``: directories whose every file is read back (``listDir`` too).
    """
    unmet: list[Unmet] = []
    if profile.tier not in envelope.tiers:
        unmet.append(Unmet("profile.tier", f"tier {profile.tier!r} is not among {list(envelope.tiers)}"))
    if platform not in envelope.platforms:
        unmet.append(Unmet("platform", f"{platform.os}/{platform.architecture} is not an advertised platform"))
    if envelope.image_mode == "fixed" and profile.base_image not in envelope.fixed_base_images:
        unmet.append(
            Unmet("profile.base_image", f"only the fixed base images {list(envelope.fixed_base_images)} are served")
        )
    for manager in profile.package_managers:
        if envelope.image_mode == "fixed":
            unmet.append(Unmet(f"profile.packages.{manager}", "fixed images materialize no packages"))
        elif manager not in envelope.package_managers:
            unmet.append(Unmet(f"profile.packages.{manager}", f"package manager {manager!r} is not materialized"))
    mode = profile.network_policy.mode
    if mode not in envelope.network_modes:
        unmet.append(
            Unmet("profile.network_policy.mode", f"network mode {mode!r} is not among {list(envelope.network_modes)}")
        )
    retention = profile.retention_mode
    if retention not in envelope.retention_modes:
        unmet.append(
            Unmet("profile.retention_mode", f"retention {retention!r} is not among {list(envelope.retention_modes)}")
        )
    if retention == "durable" and not envelope.snapshots:
        unmet.append(Unmet("profile.retention_mode", "a durable Session needs snapshots, which are not served"))
    for problem in profile.resource_limits.within(envelope.minimum_resources, envelope.maximum_resources):
        dim = problem.split(":", 1)[0]
        unmet.append(Unmet(f"profile.resource_limits.{dim}", problem.split(": ", 1)[1]))
    if mount_count > envelope.effective_max_mounts:
        unmet.append(Unmet("mounts", f"{mount_count} mounts asked, at most {envelope.effective_max_mounts} served"))
    if interactive and not envelope.declares("openProcess"):
        unmet.append(Unmet("stdin", "streaming stdin (-i) needs openProcess, which is not served"))
    if terminal and not (envelope.terminal and envelope.declares("openProcess")):
        unmet.append(Unmet("tty", "a pseudo-terminal (-t) is not served (the envelope's terminal is false)"))
    if writable_mounts and not envelope.writable_mounts:
        unmet.append(Unmet("mounts", "a writable mount (:rw) is not served (the envelope's writable_mounts is false)"))
    if mount_symlinks and not envelope.mount_symlinks:
        unmet.append(
            Unmet("mounts", "a mount holding a symlink is not served (the envelope's mount_symlinks is false)")
        )
    if (capture or capture_dirs) and not envelope.declares("readFiles"):
        unmet.append(
            Unmet("capture", "capturing files (--capture) needs readFiles, which the envelope's operations do not list")
        )
    if capture_dirs and not envelope.declares("listDir"):
        shown = ", ".join(d if d == "/" else d + "/" for d in capture_dirs)
        unmet.append(
            Unmet(
                "capture",
                f"capturing a directory ({shown}) needs listDir, which is not served (the envelope's list_dir is "
                "false); capture its files by name",
            )
        )
    return unmet


def require_capabilities(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    *,
    platform: Platform,
    mount_count: int,
    terminal: bool = False,
    writable_mounts: bool = False,
    mount_symlinks: bool = False,
    interactive: bool = False,
    capture: bool = False,
    capture_dirs: Sequence[str] = (),
) -> None:
    """Raises SandboxCapabilityUnavailable listing every unmet requirement, if any."""
    unmet = unmet_requirements(
        envelope,
        profile,
        platform=platform,
        mount_count=mount_count,
        terminal=terminal,
        writable_mounts=writable_mounts,
        mount_symlinks=mount_symlinks,
        interactive=interactive,
        capture=capture,
        capture_dirs=capture_dirs,
    )
    if unmet:
        raise SandboxCapabilityUnavailable(unmet, provider=envelope.provider)
