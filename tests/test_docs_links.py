"""docs/layout.md names every module; every relative link in the README, the docs/ pages and benchmarks/README.md points at a file or
folder of the repository (and, for a link into a Markdown page with #anchor, at one of its headings):
these pages move text between each other and benchmarks/ is pruned, so a dangling link is the
likely way for them to rot."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks, whose brackets are not links."""
    return FENCE.sub("", text)


def links(text: str) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(text))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(prose(page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_are_read():
    """The parser sees the README's links (else every page would pass with none)."""
    found = links((REPO / "README.md").read_text(encoding="utf-8"))
    assert {"docs/screenshot.png", "docs/algorithms.md", "benchmarks/README.md"} <= set(found)
    assert links("[a](x.md) ![b](y.png#z)\n```\n[c](in-a-code-block.md)\n```\n") == ["x.md", "y.png#z"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or REPO not in (dest, *dest.parents):
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def test_the_layout_page_names_every_module():
    """docs/layout.md says where each thing lives: every module of the engine, the training
    package, the figures, the page and the scripts is named there (a new file gets its line)."""
    doc = (REPO / "docs" / "layout.md").read_text()
    missing = [str(p.relative_to(REPO)) for part in ("eagle2", "eagle2_train", "viz", "ui", "scripts")
               for p in sorted((REPO / part).rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py") and f"`{p.name}`" not in doc]
    assert not missing, f"docs/layout.md does not name: {missing}"
