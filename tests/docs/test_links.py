"""Every relative link in README.md and docs/*.md leads somewhere: to a file of the checkout and,
with a #fragment, to a heading of that file, named as GitHub names headings. The docs name most
files in the text rather than linking them (`docs/otel.md`, `config/tracedb.toml`), so those
paths must exist too: a file moved or renamed leaves no page pointing at nothing."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
)

FENCED = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
# A file of the checkout named in the text: under one of its folders, with a file's extension
# (a data directory's `wal/APPLIED` is no file of the checkout), a script, or a page by its name.
CHECKOUT_PATH = re.compile(
    r"(?<![\w./~$-])("
    r"(?:docs|wal|config|scripts|tests|tracedb|benchmarks|migrations)/[\w./-]*"
    r"\.(?:md|py|toml|png|service|example|mako)"
    r"|scripts/[\w-]+"
    r"|[\w-]+\.md"
    r")(?![\w/-])"
)


def read(root: str, page: str) -> str:
    with open(os.path.join(root, page), encoding="utf-8") as f:
        return f.read()


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (a link's label, without the markup), lower
    case, without punctuation other than `-` and `_`, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in HEADING.findall(FENCED.sub("", text)):
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers a repeated heading's anchor
    return found


def broken_links(root: str, page: str) -> list[str]:
    text = INLINE_CODE.sub("", FENCED.sub("", read(root, page)))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # a URL: another site's
        path, _, fragment = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(root, file)):
            broken.append(f"{target}: no file {file}")
        elif fragment and file.endswith(".md") and fragment not in anchors(read(root, file)):
            broken.append(f"{target}: no heading #{fragment} in {file}")
    return broken


def missing_paths(root: str, page: str) -> list[str]:
    here = os.path.join(root, os.path.dirname(page))
    return sorted({
        path for path in CHECKOUT_PATH.findall(read(root, page))
        if not os.path.exists(os.path.join(root, path)) and not os.path.exists(os.path.join(here, path))
    })


@pytest.mark.parametrize("page", PAGES)
def test_each_link_leads_to_a_file_and_heading_of_the_checkout(page):
    assert broken_links(ROOT, page) == []


@pytest.mark.parametrize("page", PAGES)
def test_each_file_of_the_checkout_named_in_the_text_exists(page):
    assert missing_paths(ROOT, page) == []


def test_the_checks_find_a_missing_file_a_missing_heading_and_a_path_named_in_vain(tmp_path):
    # The two tests above pass when they find nothing; this shows what they find.
    (tmp_path / "docs").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "tracedb.toml").write_text("")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Per-row checksums\n\n```\n# Not a heading\n```\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A: `the page`\n\n[b](b.md) [b's section](b.md#per-row-checksums) [this page](#a-the-page)"
        " [site](https://example.com/x.md) ![image](gone.png) [heading](b.md#not-a-heading)\n"
        "`config/tracedb.toml`, `config/gone.toml`, docs/b.md, `docs/gone.md`, gone.md, `wal/APPLIED`\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(str(tmp_path), "docs/a.md") == [
        "gone.png: no file docs/gone.png",
        "b.md#not-a-heading: no heading #not-a-heading in docs/b.md",
    ]
    assert missing_paths(str(tmp_path), "docs/a.md") == ["config/gone.toml", "docs/gone.md", "gone.md", "nowhere.md"]


def test_headings_are_named_as_github_names_them():
    assert slug("Receiving OTLP/HTTP: `tracedb serve --otlp-port PORT`") == \
        "receiving-otlphttp-tracedb-serve---otlp-port-port"
    assert slug("`start` — begin recording an execution") == "start--begin-recording-an-execution"
    assert slug("The run before (calibration 86 ns), and the one before that") == \
        "the-run-before-calibration-86-ns-and-the-one-before-that"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
