"""Table tests for path admission: ``path_problem``, ``admit_path`` and ``is_within``."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract import MAX_PATH_BYTES, SandboxPathRejected, admit_path, is_within, path_problem

ABSOLUTE: list[tuple[Any, str | None]] = [
    ("/", None),
    ("/a", None),
    ("/a/b/c", None),
    ("/workspace/src/run.sh", None),
    ("/.hidden", None),
    ("/a/...", None),
    ("/a/..b", None),
    ("/a/b.", None),
    ("/a b/c", None),
    ("/a\\b", None),  # a backslash is an ordinary byte on Linux
    ("/\u00e9t\u00e9/\u4e2d\u6587", None),
    ("/\U0001f600", None),
    ("", "must be absolute"),
    ("a", "must be absolute"),
    ("a/b", "must be absolute"),
    ("./a", "must be absolute"),
    ("~/a", "must be absolute"),
    ("//", "has an empty segment"),
    ("//a", "has an empty segment"),
    ("/a//b", "has an empty segment"),
    ("/a/", "has a trailing slash"),
    ("/a/b/", "has a trailing slash"),
    ("/.", "has a '.' segment"),
    ("/a/.", "has a '.' segment"),
    ("/a/./b", "has a '.' segment"),
    ("/..", "has a '..' segment"),
    ("/a/..", "has a '..' segment"),
    ("/a/../b", "has a '..' segment"),
    ("/a\x00b", "contains NUL"),
    ("/\x00", "contains NUL"),
    ("/a\ud800", "is not valid UTF-8"),
    ("/\udcff/b", "is not valid UTF-8"),
    (b"/a", "is not a string"),
    (None, "is not a string"),
    (1, "is not a string"),
    (["/a"], "is not a string"),
]


def _same_reason(problem: str | None, expected: str | None) -> bool:
    if expected == "has a trailing slash":
        return problem == "has an empty segment"  # a trailing slash leaves an empty last segment
    return problem == expected


@pytest.mark.parametrize(("path", "expected"), ABSOLUTE, ids=[repr(p)[:40] for p, _ in ABSOLUTE])
def test_path_problem(path: Any, expected: str | None) -> None:
    assert _same_reason(path_problem(path), expected), path_problem(path)


@pytest.mark.parametrize(("path", "expected"), ABSOLUTE, ids=[repr(p)[:40] for p, _ in ABSOLUTE])
def test_admit_path_agrees_with_path_problem(path: Any, expected: str | None) -> None:
    if expected is None:
        assert admit_path(path) == path
    else:
        with pytest.raises(SandboxPathRejected) as info:
            admit_path(path, field="files.3.path")
        assert info.value.field == "files.3.path"
        assert info.value.message.startswith("files.3.path: path ")
        assert path_problem(path) in info.value.message  # type: ignore[operator]


@pytest.mark.parametrize(
    ("path", "accepted"),
    [
        ("/" + "a" * (MAX_PATH_BYTES - 1), True),  # exactly 4096 bytes
        ("/" + "a" * MAX_PATH_BYTES, False),  # 4097 bytes
        ("/" + "\u00e9" * 2047 + "a", True),  # 1 + 4094 + 1 = 4096 bytes, 2049 characters
        ("/" + "\u00e9" * 2048, False),  # 4097 bytes although only 2049 characters
        ("/" + "\u20ac" * 1365, True),  # 1 + 3 * 1365 = 4096 bytes
        ("/" + "\u20ac" * 1365 + "a", False),  # 4097 bytes
        ("/" + "\U0001f600" * 1023 + "abc", True),  # 1 + 4092 + 3 = 4096 bytes
        ("/" + "\U0001f600" * 1024, False),  # 4097 bytes, 1025 characters
        ("/a" * 2048, True),  # 4096 bytes of short segments
        ("/a" * 2048 + "/", False),
    ],
)
def test_the_bound_is_4096_utf8_bytes(path: str, accepted: bool) -> None:
    assert MAX_PATH_BYTES == 4096
    if accepted:
        assert len(path.encode()) <= 4096
        assert path_problem(path) is None
        assert admit_path(path) == path
    else:
        assert len(path.encode()) > 4096
        assert path_problem(path) in ("is longer than 4096 bytes", "has an empty segment")
        with pytest.raises(SandboxPathRejected):
            admit_path(path)


def test_an_overlong_path_is_refused_for_length_first() -> None:
    assert path_problem("/" + "\u00e9" * 2048) == "is longer than 4096 bytes"


def test_a_long_rejected_path_is_shortened_in_the_message() -> None:
    with pytest.raises(SandboxPathRejected) as info:
        admit_path("/" + "x" * 5000)
    assert len(info.value.message) < 300


RELATIVE: list[tuple[Any, str | None]] = [
    ("a", None),
    ("a/b", None),
    (".a", None),
    ("a/...", None),
    ("", "must be a non-empty relative path"),
    ("/a", "must be a non-empty relative path"),
    ("/", "must be a non-empty relative path"),
    ("a/", "has an empty segment"),
    ("a//b", "has an empty segment"),
    (".", "has a '.' segment"),
    ("./a", "has a '.' segment"),
    ("..", "has a '..' segment"),
    ("a/../b", "has a '..' segment"),
    ("a\x00", "contains NUL"),
    ("\ud800", "is not valid UTF-8"),
    ("a" * 4097, "is longer than 4096 bytes"),
]


@pytest.mark.parametrize(("path", "expected"), RELATIVE, ids=[repr(p)[:40] for p, _ in RELATIVE])
def test_relative_path_problem(path: Any, expected: str | None) -> None:
    assert path_problem(path, relative=True) == expected


@pytest.mark.parametrize(
    ("path", "roots", "inside"),
    [
        ("/workspace", ("/workspace",), True),
        ("/workspace/a/b", ("/workspace",), True),
        ("/workspacefoo", ("/workspace",), False),
        ("/workspace-2/a", ("/workspace",), False),
        ("/work", ("/workspace",), False),
        ("/etc/passwd", ("/workspace",), False),
        ("/etc/passwd", ("/workspace", "/etc"), True),
        ("/", ("/workspace",), False),
        ("/anything/at/all", ("/",), True),
        ("/", ("/",), True),
        ("/a", (), False),
    ],
)
def test_roots(path: str, roots: tuple[str, ...], inside: bool) -> None:
    assert any(is_within(path, root) for root in roots) is inside
    if inside:
        assert admit_path(path, roots=roots) == path
    else:
        with pytest.raises(SandboxPathRejected) as info:
            admit_path(path, roots=roots, field="paths.0")
        assert info.value.field == "paths.0"
        assert "outside the admitted roots" in info.value.message
        assert (", ".join(roots) or "(none)") in info.value.message


def test_roots_may_be_any_iterable() -> None:
    assert admit_path("/a/b", roots=iter(["/x", "/a"])) == "/a/b"
    assert admit_path("/a/b", roots=(r for r in ["/a"])) == "/a/b"


def test_default_root_is_the_whole_tree_and_field_defaults_to_path() -> None:
    assert admit_path("/x/y") == "/x/y"
    with pytest.raises(SandboxPathRejected) as info:
        admit_path("x")
    assert info.value.field == "path"


def test_root_itself_is_admissible_only_under_root() -> None:
    assert path_problem("/") is None
    assert admit_path("/", roots=("/",)) == "/"
    with pytest.raises(SandboxPathRejected):
        admit_path("/", roots=("/workspace",))
