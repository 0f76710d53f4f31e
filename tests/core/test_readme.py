"""The README and docs/ stay true to the tree they describe: the two commands a newcomer runs are Makefile
targets, the layout table's line counts are within 10% of the files' (or 25 lines, for the small rows), every
path the README names exists, every relative link in README.md and docs/*.md reaches a file and, with a
`#anchor`, one of its headings, and docs/ holds no metrics file or plot that no document cites.

10% lets others' ordinary edits through; a package that grows or shrinks by a tenth needs its row updated:
`python scripts/readme_line_counts.py --write` (which also says what a row counts).
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOLERANCE, MIN_SLACK = 0.10, 25
sys.path.insert(0, str(ROOT / "scripts"))
from readme_line_counts import actual_lines, counted_files, layout_rows  # noqa: E402


def test_readme_opens_with_the_two_commands_and_the_makefile_defines_them():
    first_block = README.read_text().split("```")[1]
    commands = [line.split("#")[0].split() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == [["make", "demo"], ["make", "test"]], f"README's first code block: {first_block!r}"
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"demo", "test"} <= set(targets)


def test_readme_layout_line_counts_are_within_ten_percent():
    rows = layout_rows(README.read_text())
    assert len(rows) >= 8, "the README's layout table was not found (a header `| path | lines | ... |`)"
    wrong = []
    for _, paths, stated in rows:
        assert all(counted_files(p) for p in paths), f"layout row {paths} names no file"
        actual = actual_lines(paths)
        if abs(actual - stated) > max(TOLERANCE * actual, MIN_SLACK):
            wrong.append(f"{', '.join(paths)}: README says {stated:,}, the files have {actual:,}")
    assert not wrong, ("run python scripts/readme_line_counts.py --write; the README's layout table is stale: "
                       + "; ".join(wrong))


def test_paths_the_readme_names_exist():
    """Every `minirl/...`, `recipes/...`, `scripts/...`, `tests/...`, `docs/...` in backticks exists; a bare file
    name (`verdict.py`, `sandbox.c` beside its package's path) exists at the top or somewhere in minirl/."""
    named, bare = set(), set()
    for token in re.findall(r"`([^`\s]+)`", README.read_text()):
        path = token.split(":")[0].rstrip(",.")
        if re.match(r"(minirl|recipes|scripts|tests|docs)/", path):
            named.add(path)
        elif re.fullmatch(r"\w+\.(py|c)", path):
            bare.add(path)
    missing = sorted(p for p in named if "*" not in p and not (ROOT / p).exists())
    missing += sorted(b for b in bare if not (ROOT / b).exists() and not any((ROOT / "minirl").rglob(b)))
    assert named and not missing, f"the README names paths that do not exist: {missing}"


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    in_code = False
    for line in md.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_links_in_readme_and_docs_reach_a_file_and_heading():
    broken = []
    for md in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "minirl" / "judge" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (md.parent / file).resolve() if file else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)} -> {target} (no such heading)")
    assert not broken, "; ".join(broken)


def expand_braces(text: str) -> list[str]:
    """`a{0,1}b` -> [`a0b`, `a1b`] (one level per brace, as the docs write file sets)."""
    m = re.search(r"\{([^{}]*)\}", text)
    if not m:
        return [text]
    return [x for part in m.group(1).split(",") for x in expand_braces(text[:m.start()] + part + text[m.end():])]


def test_docs_hold_no_metrics_file_or_plot_that_no_document_cites():
    cited = set()
    for md in [README, *(ROOT / "docs").glob("*.md")]:
        for token in re.findall(r"[\w{},./-]+\.(?:jsonl|png)", md.read_text()):
            cited |= {Path(t).name for t in expand_braces(token)}
    stray = sorted(p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".jsonl", ".png") and p.name not in cited)
    assert not stray, f"docs/ holds files no document cites (move them out, keep the command that makes them): {stray}"
