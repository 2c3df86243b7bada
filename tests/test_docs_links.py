"""Every relative link of the project's Markdown leads to a file that exists, and to a heading
of it when the link names one: pages split and headings renamed must not leave links behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("benchmarks/*.md"),
    ]
)
# [text](target) and ![alt](target), outside code; a target has no spaces.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*`{3,}")


def _outside_fences(text: str) -> list[str]:
    """The lines of a page that are not in fenced blocks (whose '#' are not headings)."""
    kept, inside = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            inside = not inside
        elif not inside:
            kept.append(line)
    return kept


def _prose(text: str) -> str:
    """The page without fenced blocks and inline code, where brackets are not links."""
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in _outside_fences(text))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _outside_fences(page.read_text()):
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if not match:
            continue
        base = github_anchor(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def _links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in _LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize(
    ("page", "target"),
    _links(),
    ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in _links()],
)
def test_relative_link_resolves(page: Path, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    assert destination.exists(), f"{page.relative_to(ROOT)}: {target} names no file"
    if anchor:
        assert anchor in anchors_of(destination), (
            f"{page.relative_to(ROOT)}: {target}: no heading of "
            f"{destination.relative_to(ROOT)} has the id {anchor!r}"
        )


def test_slugs_follow_githubs_rule() -> None:
    assert github_anchor("Shared-memory rings on one host (2026-12-03, AMD EPYC)") == (
        "shared-memory-rings-on-one-host-2026-12-03-amd-epyc"
    )
    assert github_anchor("Settings of the process's server") == (
        "settings-of-the-processs-server"
    )
    assert github_anchor("One allreduce's path") == "one-allreduces-path"
