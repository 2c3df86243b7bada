"""The code blocks of the project's Markdown, and what each block's marker says to do with it.

Every fenced block in Python or shell (```python, ```py, ```bash, ```sh, ```shell) must
follow an HTML comment on the line just above it (blank lines between are allowed):

    <!-- example: run -->                    one process (Python) or a bash script
    <!-- example: run ranks=2 -->            Python on 2 local ranks, with torchrun's
                                             variables (MASTER_ADDR, MASTER_PORT, RANK,
                                             LOCAL_RANK, WORLD_SIZE) set
    <!-- example: run ranks=3 oracle=gloo --> the same, then again with "grpc" replaced by
                                             "gloo": every rank must print the same
    <!-- example: run expect="TEXT" -->      what the example prints must contain TEXT
    <!-- example: run file=NAME -->          saved as NAME in the working directory of every
                                             example of the same page, and run
    <!-- example: save file=NAME -->         only saved, for later blocks of the page
    <!-- example: job=NAME ranks=3 -->       not run alone: started in the background for
                                             the blocks that say during=NAME
    <!-- example: run during=NAME expect="TEXT" -->  run while job NAME runs, again and
                                             again until it prints TEXT (the job's state
                                             forms over time) or the time runs out
    <!-- example: run env="K=V K2=V2" timeout=90 -->  extra variables; seconds allowed
    <!-- example: skip REASON -->            not run; the reason says why (a build, a
                                             benchmark, a second machine, a placeholder)

A block without a marker fails the suite, so that no example in the docs goes untested
without saying why. This module only reads Markdown; running is test_docs_examples.py's.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

LANGUAGES = {
    "python": "python",
    "py": "python",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
}
VERBS = ("run", "skip", "save", "job")
KEYS = ("ranks", "oracle", "expect", "file", "env", "during", "timeout")
ORACLES = ("gloo",)
DEFAULT_TIMEOUT_S = 60.0

_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<info>[^`]*)$")


class MarkerError(ValueError):
    """A marker that cannot be read; the message says where and how to write it."""


@dataclass(frozen=True)
class Marker:
    """What the comment above a block asks for."""

    verb: str
    reason: str = ""
    ranks: int = 0  # 0: one plain process, no distributed variables
    oracle: str = ""
    expect: str = ""
    file: str = ""
    env: dict[str, str] = field(default_factory=dict)
    during: str = ""
    job: str = ""
    timeout: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Example:
    """One fenced block of Python or shell, where it is, and its marker (None: unmarked)."""

    path: Path
    line: int  # of the opening fence, from 1
    language: str  # "python" or "bash"
    code: str
    marker: Marker | None

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"


def parse_marker(body: str, where: str) -> Marker:
    """The marker of `<!-- example: BODY -->`; MarkerError if it is not one."""
    verb, _, rest = body.partition(" ")
    if verb.startswith("job="):
        verb, rest = "job", body
    if verb not in VERBS:
        raise MarkerError(
            f"{where}: the marker starts with {verb!r}; start it with one of {', '.join(VERBS)}"
        )
    if verb == "skip":
        if not rest.strip():
            raise MarkerError(
                f"{where}: say why the block is not run: <!-- example: skip REASON -->"
            )
        return Marker("skip", reason=rest.strip())
    values: dict[str, str] = {}
    for token in shlex.split(rest):
        key, eq, value = token.partition("=")
        if key == "job" and verb == "job":
            values["job"] = value
            continue
        if not eq or key not in KEYS:
            raise MarkerError(
                f"{where}: {token!r} is not KEY=VALUE with KEY one of {', '.join(KEYS)}"
            )
        values[key] = value
    return _marker(verb, values, where)


def _marker(verb: str, values: dict[str, str], where: str) -> Marker:
    try:
        ranks = int(values.get("ranks", "0"))
        timeout = float(values.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise MarkerError(f"{where}: ranks and timeout take numbers ({exc})") from None
    oracle = values.get("oracle", "")
    if oracle and oracle not in ORACLES:
        raise MarkerError(f"{where}: oracle={oracle!r}; the oracle is one of {ORACLES}")
    if oracle and ranks < 2:
        raise MarkerError(f"{where}: an oracle compares ranks: give ranks=2 or more")
    if verb == "job" and (not values.get("job") or ranks < 1):
        raise MarkerError(f"{where}: a job needs a name and ranks: job=NAME ranks=N")
    if verb == "save" and not values.get("file"):
        raise MarkerError(f"{where}: save needs file=NAME")
    env: dict[str, str] = {}
    for item in shlex.split(values.get("env", "")):
        key, eq, value = item.partition("=")
        if not eq:
            raise MarkerError(f"{where}: env takes K=V pairs, got {item!r}")
        env[key] = value
    return Marker(
        verb,
        ranks=ranks,
        oracle=oracle,
        expect=values.get("expect", ""),
        file=values.get("file", ""),
        env=env,
        during=values.get("during", ""),
        job=values.get("job", ""),
        timeout=timeout,
    )


def extract(path: Path) -> list[Example]:
    """Every Python and shell block of `path`, in order; MarkerError for a bad marker."""
    lines = path.read_text().splitlines()
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        close = _closing_fence(lines, i + 1, fence["ticks"])
        info = fence["info"].strip().split()
        language = LANGUAGES.get(info[0].lower()) if info else None
        if language is not None:
            body = lines[i + 1 : close]
            code = "\n".join(_dedent(body, len(fence["indent"]))) + "\n"
            where = f"{path.name}:{i + 1}"
            examples.append(
                Example(path, i + 1, language, code, _marker_above(lines, i, where))
            )
        i = close + 1
    return examples


def _closing_fence(lines: list[str], start: int, ticks: str) -> int:
    for j in range(start, len(lines)):
        stripped = lines[j].strip()
        if stripped.startswith(ticks) and not stripped.strip("`"):
            return j
    return len(lines)


def _dedent(body: list[str], indent: int) -> list[str]:
    # A block inside a list item is indented as a whole; its own indentation stays.
    return [line[indent:] if line[:indent].isspace() else line for line in body]


def _marker_above(lines: list[str], fence: int, where: str) -> Marker | None:
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    match = _MARKER.match(lines[j]) if j >= 0 else None
    return parse_marker(match["body"], where) if match else None


def doc_pages(root: Path) -> list[Path]:
    """The pages whose examples are tested: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]
