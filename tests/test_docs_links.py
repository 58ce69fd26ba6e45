"""Every relative link in README.md and docs/*.md resolves: the file exists, and a `#anchor` names
a heading of the target file under GitHub's slug rules. Web and mail links are not followed."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\S\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); text may hold one level of brackets (an image in a link).
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=\"([^\"]+)\"", re.I)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, punctuation but - and _ dropped,
    spaces turned into hyphens (nothing collapsed, so ` → ` gives `--`)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page offers: one per heading (a repeated slug gets -1, -2, ...), and HTML anchors."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, title in HEADING.findall(text):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return INLINE_LINK.findall(text) + REFERENCE_DEF.findall(text)


def problems(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the relative links of one page (an empty list when they all resolve)."""
    found = []
    for target in links(page):
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http(s):, mailto: and other schemes are not checked
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        where = f"{page.relative_to(root)}: ({target})"
        shown = dest.relative_to(root) if dest.is_relative_to(root) else dest
        if not dest.exists():
            found.append(f"{where}: no file {shown}")
        elif anchor and dest.suffix.lower() == ".md" and unquote(anchor).lower() not in anchors(dest):
            found.append(f"{where}: no heading in {shown} makes the anchor #{anchor}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert problems(page) == []


def test_every_docs_page_links_back_to_readme() -> None:
    missing = [p.name for p in PAGES[1:] if "](../README.md" not in p.read_text(encoding="utf-8")]
    assert missing == []


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Reverse jobs: NServiceBus → legacy", "reverse-jobs-nservicebus--legacy"),
    ("Running for months: `qbridge run`", "running-for-months-qbridge-run"),
    ("`bench/lag_reverse.py`", "benchlag_reversepy"),
    ("Publish/subscribe", "publishsubscribe"),
    ("What a migrated NGinn message looks like", "what-a-migrated-nginn-message-looks-like"),
])
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some part\n\n```\n[not a link](gone.md)\n```\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#some-part) [web](https://example.org/x#y) `[code](nope.md)`\n"
                    "[no file](docs/b.md) [no anchor](docs/a.md#other-part) [self](#a-front)\n\n# A front\n")
    assert problems(page, tmp_path) == [
        "README.md: (docs/b.md): no file docs/b.md",
        "README.md: (docs/a.md#other-part): no heading in docs/a.md makes the anchor #other-part",
    ]


def test_the_systemd_unit_has_no_comment_after_a_value() -> None:
    """systemd reads `Key=value  # note` as a value that ends in '# note' (a path that does not exist)."""
    text = (ROOT / "docs" / "running.md").read_text()
    units = re.findall(r"```ini\n(.*?)```", text, re.S)
    assert units, "docs/running.md has no systemd unit"
    for unit in units:
        for line in unit.splitlines():
            if "=" in line and not line.lstrip().startswith(("#", ";")):
                assert "#" not in line.split("=", 1)[1], line
