"""``resource_limits: runner_enforced`` is claimed only with cgroups, and each of its dimensions holds.

Each limit is shown from outside its cgroup files: a process that asks for more
than the profile allows is refused by the kernel, and the same process under a
larger limit is not (so it is the limit that refused it, not the program).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_host_process import PYTHON, Kit, kit, needs_cgroups

from checkfu.contract.errors import SandboxProviderFailed

__all__ = ["kit"]

ALLOCATE = "import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')"
FORK = textwrap.dedent(
    """
    import os, time
    made = 0
    for _ in range(40):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    print(made)
    """
)
SPIN = "import os, time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass\nprint(sum(os.times()[:2]))"


def limits(**dims: int) -> dict[str, int]:
    return {"cpu_millis": 2000, "memory_mib": 512, "disk_mib": 256, "pids": 256, **dims}


@pytest.mark.anyio
async def test_the_memory_limit_holds(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-mem", profile=kit.profile(resource_limits=limits(memory_mib=64)))
    over = await kit.run(call, PYTHON, "-c", ALLOCATE, "256")
    assert over.exit_code == 137, over.stderr  # the kernel's OOM killer, inside the instance's cgroup
    assert b"allocated" not in over.stdout
    under = await kit.run(call, PYTHON, "-c", ALLOCATE, "8")
    assert (under.exit_code, under.stdout) == (0, b"allocated\n")


@pytest.mark.anyio
async def test_the_pids_limit_holds(kit: Kit) -> None:
    needs_cgroups(kit)
    tight = await kit.active("ak-pids", profile=kit.profile(resource_limits=limits(pids=16)))
    made = int((await kit.run(tight, PYTHON, "-c", FORK)).stdout)
    assert 0 < made < 16
    roomy = await kit.active("ak-pids-roomy", profile=kit.profile(resource_limits=limits(pids=128)))
    assert int((await kit.run(roomy, PYTHON, "-c", FORK)).stdout) == 40


@pytest.mark.anyio
async def test_the_cpu_limit_holds(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-cpu", profile=kit.profile(resource_limits=limits(cpu_millis=100)))
    used = float((await kit.run(call, PYTHON, "-c", SPIN)).stdout)
    assert used < 0.45  # a tenth of a core for 1.5 s is 0.15 s of CPU; unbounded it would be up to 1.5 s


@pytest.mark.anyio
async def test_the_runner_is_never_inside_an_instance_cgroup(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-self")
    await kit.run(call, "true")
    own = Path("/proc/self/cgroup").read_text()
    assert "checkfu-hp-" not in own
    tasks = Path("/proc/thread-self/cgroup").read_text()
    assert "checkfu-hp-" not in tasks


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_spawning_does_not_loop_over_the_descriptor_limit(tmp_path: Path) -> None:
    """Under a high RLIMIT_NOFILE, one provision-exec-release makes a handful of close() calls, not thousands."""
    script = textwrap.dedent(
        f"""
        import asyncio, resource, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        from test_host_process import make_kit
        from checkfu.providers.host_process import HostProcessProvider

        async def main():
            kit = make_kit(HostProcessProvider(state_dir={str(tmp_path / "state")!r}))
            call = await kit.active("ak-strace")
            assert (await kit.run(call, "true")).exit_code == 0
            await kit.release(call)
            print(hard)

        asyncio.run(main())
        """
    )
    trace = tmp_path / "trace"
    done = subprocess.run(
        ["strace", "-f", "-e", "trace=close,close_range", "-o", str(trace), sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 and "PTRACE" in done.stderr.upper():
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    limit = int(done.stdout.split()[-1])
    closes = sum(1 for line in trace.read_text().splitlines() if " close(" in line)
    assert limit >= 4096, "the host's hard limit is too low for this test to tell a loop from none"
    assert closes < limit // 4


@pytest.mark.anyio
async def test_a_cgroup_that_vanished_is_the_providers_failure_not_the_programs(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-gone")
    held = kit.provider._instances[call["instance_id"]].cgroups
    assert held is not None
    held.dirs["pids"].rmdir()  # empty, so the kernel lets it go
    with pytest.raises(SandboxProviderFailed) as failed:
        await kit.run(call, "true")
    assert "cgroups" in failed.value.message
