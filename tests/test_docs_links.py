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


NAMED_PAGES = ["layout.md", "cli.md", "algorithms.md", "app.md", "serving.md", "training.md"]
CODE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
FILE_EXTS = (".py", ".h", ".cpp", ".sh", ".md", ".txt", ".toml", ".json", ".jsonl", ".safetensors", ".css")
# named in the docs, not this repository's: SGLang's and vLLM's EAGLE-3 loader, the Hub's doc pages,
# huggingface_hub's Xet uploader
ELSEWHERE = {"llama_eagle3.py", "spaces-gpus.md", "spaces-overview.md", "spaces-zerogpu.md", "hf_xet"}


def tracked_files() -> list[str]:
    import subprocess
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return out.split()


def code_text() -> str:
    """The project's code and configuration (not its docs, data or weights), as one text."""
    return "\n".join((REPO / f).read_text(encoding="utf-8", errors="replace") for f in tracked_files()
                     if f.endswith((".py", ".h", ".cpp", ".sh", ".toml", ".css", ".txt"))
                     and not f.startswith("benchmarks/"))


@pytest.mark.parametrize("name", NAMED_PAGES)
def test_the_docs_name_only_what_exists(name):
    """What a page names in backticks exists: a file (by path; by name for a module or a file the
    code writes), or, for a code name with an underscore or a dot (`load_bundle`,
    `Decoder.speculate`), every part of it somewhere in the code. A renamed function or a deleted
    file shows here, not in a reader's search."""
    files = tracked_files()
    basenames = {f.rsplit("/", 1)[-1] for f in files}
    code = code_text()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))
    missing = []
    for tok in re.findall(r"`([^`\n]+)`", prose((REPO / "docs" / name).read_text(encoding="utf-8"))):
        t = tok.strip().removesuffix("()").rstrip("/")
        if " " in t or "*" in t or "{" in t or "<" in t or t.startswith(("-", "$", "http")) or t in ELSEWHERE:
            continue
        if t.endswith(FILE_EXTS) and CODE_NAME.fullmatch(t.rsplit("/", 1)[-1].rsplit(".", 1)[0].replace("-", "_")):
            if "/" in t:
                ok = (REPO / t).exists() or any(f.endswith(t) for f in files) or t.startswith(("~", "/"))
            else:   # a module, or a file the code writes (a cache, an index)
                ok = t in basenames or f'"{t}"' in code
        elif CODE_NAME.fullmatch(t) and ("_" in t or "." in t):
            ok = all(part in words for part in t.split("."))
        else:
            continue
        if not ok:
            missing.append(tok)
    assert not missing, f"docs/{name} names what is not in the repository: {sorted(set(missing))}"
