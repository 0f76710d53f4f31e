"""The README's layout table against the tree: each row's stated line count beside the files' own.

    python scripts/readme_line_counts.py            # print each row: stated, actual, off by
    python scripts/readme_line_counts.py --write    # rewrite the table's figures with the actual counts

A row's path cell lists files, globs (`minirl/*.py`) or folders (`minirl/judge/`); a folder counts its `.py`,
`.c`, `.sh` and `.yaml` files, recursively. tests/core/test_readme.py fails when a figure is off by more than
10% (or 25 lines, for the small rows); run this with --write then.
"""
import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COUNTED = (".py", ".c", ".sh", ".yaml")
HEADER = "| path | lines |"


def counted_files(item: str) -> list[Path]:
    """The files a layout row's path names: a folder (trailing /), a glob, or a file."""
    if item.endswith("/"):
        return sorted(p for p in (ROOT / item).rglob("*")
                      if p.is_file() and p.suffix in COUNTED and "__pycache__" not in p.parts)
    if "*" in item:
        return sorted(ROOT.glob(item))
    return [ROOT / item]


def actual_lines(paths: list[str]) -> int:
    return sum(len(f.read_text(errors="replace").splitlines()) for p in paths for f in counted_files(p))


def layout_rows(text: str) -> list[tuple[int, list[str], int]]:
    """(line index, paths, stated count) for each row of the layout table (the one headed `| path | lines |`)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER)) + 2
    rows = []
    for i in range(start, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = lines[i].split("|")
        rows.append((i, re.findall(r"`([^`]+)`", cells[1]), int(cells[2].strip().replace(",", ""))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite the README's figures with the actual counts")
    args = ap.parse_args()
    text = README.read_text()
    lines = text.splitlines(keepends=True)
    for i, paths, stated in layout_rows(text):
        actual = actual_lines(paths)
        print(f"{', '.join(paths):28} README {stated:>7,}  files {actual:>7,}  off by {actual - stated:+,}")
        cells = lines[i].split("|")
        cells[2] = f" {actual:,} "
        lines[i] = "|".join(cells)
    if args.write:
        README.write_text("".join(lines))


if __name__ == "__main__":
    main()
