"""The user's guide and the docs: every relative link resolves, and the README stays short.

A relative markdown link (`[text](path)`, `![alt](path)`, `[text](path#anchor)`,
`[text]: path`) in README.md or a page under docs/ must name a file or folder that exists,
relative to the page; an anchor into a markdown page must be produced by one of its headings
under GitHub's rules (lowercased, punctuation other than '-' and '_' removed, each space a '-',
a repeated heading suffixed -1, -2, ...). Links with a scheme (http, https, mailto, ...) are not
checked; nor is text inside fenced code blocks or inline code, which GitHub does not render as
links.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 260

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1)[^\n]|\n(?!\s*\n))+?\1")
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines with fenced code blocks blanked and inline code (which may span lines
    within a paragraph) removed, numbered from 1."""
    kept = []
    fence = None
    for line in text.splitlines():
        marker = _FENCE.match(line.lstrip())
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif marker.group(1) == fence:
                fence = None
            kept.append("")
        else:
            kept.append(line if fence is None else "")
    prose = _INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(kept))
    return list(enumerate(prose.split("\n"), start=1))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the -1, -2 of repeated headings)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of a markdown page produce."""
    seen: dict[str, int] = {}
    result = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        marker = _FENCE.match(line.lstrip())
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif marker.group(1) == fence:
                fence = None
            continue
        heading = _HEADING.match(line) if fence is None else None
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link on a markdown page, code excluded."""
    found = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        targets = [m.group(1) for m in _INLINE_LINK.finditer(line)]
        reference = _REFERENCE_DEF.match(line)
        if reference:
            targets.append(reference.group(1))
        found.extend((number, target.strip("<>")) for target in targets)
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """'page:line: target (why)' for each relative link of the page that does not resolve.

    Args:
        path: the markdown page.
        root: the folder the page is named relative to in the messages.
    """
    where = path.relative_to(root)
    problems = []
    for number, target in links(path):
        if _SCHEME.match(target):
            continue  # http(s), mailto, ...: not checked here
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{where}:{number}: {target} (no such file: {file_part})")
            continue
        is_page = resolved.is_file() and resolved.suffix == ".md"
        if anchor and is_page and anchor not in anchors(resolved):
            problems.append(
                f"{where}:{number}: {target} (no heading of {resolved.name} gives #{anchor})"
            )
    return problems


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_resolves() -> None:
    problems = [problem for page in _pages() for problem in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_pages_are_found_and_have_links() -> None:
    pages = _pages()
    assert (ROOT / "docs" / "INTERFACES.md") in pages
    assert (ROOT / "docs" / "BENCHMARKS.md") in pages
    assert len(links(ROOT / "README.md")) >= 10  # the checker reads the README's links


def test_the_checker_reports_broken_links(tmp_path: Path) -> None:
    """Positive control: a page with good and broken links of every kind."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "OTHER.md").write_text(
        "# Other page\n\n## Faults (tested in test/x.py)\n\n## Faults (tested in test/x.py)\n"
        "\n```\n## not a heading\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "picture.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "# Title",
                "[good](docs/OTHER.md) and ![good](picture.png) and [web](https://x.invalid/a)",
                "[good anchor](docs/OTHER.md#faults-tested-in-testxpy)",
                "[repeated heading](docs/OTHER.md#faults-tested-in-testxpy-1)",
                "[own anchor](#title) and [folder](docs/)",
                "[missing](docs/MISSING.md)",
                "[bad anchor](docs/OTHER.md#not-a-heading)",
                "[bad own anchor](#nothing)",
                "`[in code](nowhere.md)`",
                "```",
                "[in a fence](nowhere.md)",
                "```",
                "[ref]: docs/GONE.md",
                "a code span `across",
                "two lines [x](nowhere.md)` then [after it](docs/AFTER.md)",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    problems = broken_links(tmp_path / "README.md", root=tmp_path)
    assert [p.split(" (")[0] for p in problems] == [
        "README.md:6: docs/MISSING.md",
        "README.md:7: docs/OTHER.md#not-a-heading",
        "README.md:8: #nothing",
        "README.md:13: docs/GONE.md",
        "README.md:15: docs/AFTER.md",
    ], problems
    assert "no such file: docs/MISSING.md" in problems[0]
    assert "no heading of OTHER.md gives #not-a-heading" in problems[1]


def test_github_slugs() -> None:
    assert github_slug("Faults (tested in test/integration/test_fault_injection.py)") == (
        "faults-tested-in-testintegrationtest_fault_injectionpy"
    )
    assert github_slug("Chunk transitions: `rtc`, `blend`, `replace`") == (
        "chunk-transitions-rtc-blend-replace"
    )
    assert github_slug("Observation -> action latency") == "observation---action-latency"


def test_readme_is_a_short_guide() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
