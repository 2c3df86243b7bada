"""The marker convention of tests/doc_examples.py: what it accepts, and what it refuses with a
message that says how to write the marker. No rank is started here."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_examples import Marker, MarkerError, extract, parse_marker


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_block_without_a_marker_is_found_unmarked(tmp_path: Path) -> None:
    page = _page(tmp_path, "Some text.\n\n```python\nprint(1)\n```\n")
    [example] = extract(page)
    assert example.marker is None
    assert example.name == "page.md:3"


def test_blocks_of_other_languages_are_not_examples(tmp_path: Path) -> None:
    page = _page(
        tmp_path, "```yaml\na: 1\n```\n\n```\nplain\n```\n\n```mermaid\nx\n```\n"
    )
    assert extract(page) == []


def test_a_marker_applies_across_blank_lines_and_indentation(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "- item\n\n  <!-- example: run ranks=2 oracle=gloo -->\n\n"
        "  ```sh\n  echo hi\n    indented\n  ```\n",
    )
    [example] = extract(page)
    assert example.language == "bash"
    assert example.code == "echo hi\n  indented\n"
    assert example.marker == Marker("run", ranks=2, oracle="gloo")


def test_every_key_is_read() -> None:
    marker = parse_marker(
        'run ranks=3 expect="a b" file=x.py env="A=1 B=two" during=job timeout=9',
        "here",
    )
    assert marker == Marker(
        "run",
        ranks=3,
        expect="a b",
        file="x.py",
        env={"A": "1", "B": "two"},
        during="job",
        timeout=9.0,
    )
    assert parse_marker("job=hung ranks=3", "here") == Marker(
        "job", job="hung", ranks=3
    )
    assert parse_marker("skip needs two machines", "here").reason == (
        "needs two machines"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("skip", "say why"),
        ("maybe", "start it with one of"),
        ("run colour=red", "is not KEY=VALUE"),
        ("run ranks=two", "take numbers"),
        ("run oracle=gloo", "give ranks=2 or more"),
        ("run ranks=2 oracle=nccl", "the oracle is one of"),
        ("job=hung", "a job needs a name and ranks"),
        ("save", "save needs file=NAME"),
        ('run env="NOEQUALS"', "env takes K=V pairs"),
    ],
)
def test_unreadable_markers_say_how_to_write_them(body: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        parse_marker(body, "page.md:1")
