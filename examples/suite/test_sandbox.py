"""A small test suite that runs *inside* a sandbox and checks what it can see.

`checkfu run` stages this repository into /workspace as a Git mount and runs it
with the standard library's unittest, so the image needs nothing but python3.
"""

import os
import pathlib
import unittest

WORKSPACE = pathlib.Path("/workspace")


class TheMount(unittest.TestCase):
    def test_this_file_was_staged(self) -> None:
        self.assertTrue((WORKSPACE / "examples" / "suite" / "test_sandbox.py").is_file())

    def test_the_mount_is_sealed(self) -> None:
        with self.assertRaises(OSError):
            (WORKSPACE / "written-from-inside").write_text("no")


class TheConfinement(unittest.TestCase):
    def test_not_root(self) -> None:
        self.assertNotEqual(os.geteuid(), 0)

    def test_root_filesystem_is_read_only(self) -> None:
        with self.assertRaises(OSError):
            pathlib.Path("/etc/written-from-inside").write_text("no")

    def test_only_loopback(self) -> None:
        interfaces = sorted(os.listdir("/sys/class/net"))
        self.assertEqual(interfaces, ["lo"])

    def test_no_capabilities(self) -> None:
        status = pathlib.Path("/proc/self/status").read_text()
        cap_eff = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
        self.assertEqual(int(cap_eff, 16), 0)

    def test_no_credentials_in_the_environment(self) -> None:
        leaked = [k for k in os.environ if any(s in k.upper() for s in ("TOKEN", "SECRET", "PASSWORD", "KEY"))]
        self.assertEqual(leaked, [])


if __name__ == "__main__":
    unittest.main()
