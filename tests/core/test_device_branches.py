"""Every branch that only a GPU (or an optional kernel) takes is named, tested on CPU, and documented.

minirl's CI has no GPU, so a branch that depends on the device, the dtype or an optional kernel would never run.
Each such place in the source carries a tag, `# device-branch: NAME`, on its line or the lines just above. This
test finds the places from the source (the patterns below) and checks that:
1. each carries a tag;
2. each tag is forced by at least one test, marked `@pytest.mark.device_branch("NAME", ...)`: the test selects
   the GPU's branch on CPU (an overridden selector, CPU bf16 autocast standing in for CUDA's, a stand-in
   flash-attn that enforces its dtype and padding rules, a patched `torch.cuda`);
3. docs/scale.md's table of device branches lists each tag, with whether it has run on a real GPU.
`scripts/gpu_check.sh` runs the marked tests on a GPU machine (`pytest -m device_branch`).
"""
import ast
import re
from pathlib import Path

from conftest import ROOT

PATTERN = re.compile(r"torch\.cuda\.|\.is_available\(\)|device\.type|\.type == \"cuda\"|flash_attn|"
                     r"flash_attention|bitsandbytes|is_autocast_enabled|mkldnn|_for_cpu\b|mem_get_info")
# torch.distributed's presence (on every machine), and a config field's type (a value, not a branch)
NOT_DEVICE = re.compile(r"\bdist\.is_available\(\)|^\s*\w+: Literal\[.*")
TAG = re.compile(r"#\s*device-branch:\s*([a-z0-9_./-]+)")
SOURCES = [*sorted((ROOT / "minirl").rglob("*.py")), ROOT / "train.py", ROOT / "eval.py",
           *sorted((ROOT / "recipes").glob("*.py"))]


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def device_places() -> list[tuple[str, int, str, str | None]]:
    """(file, line number, line, its tag or None) for each device-dependent line of code."""
    places = []
    for path in SOURCES:
        text = path.read_text()
        lines, skip = text.splitlines(), _docstring_lines(ast.parse(text))
        for i, line in enumerate(lines, 1):
            code = line.split("#", 1)[0]
            if i in skip or not PATTERN.search(code) or NOT_DEVICE.search(code) and not \
                    PATTERN.search(NOT_DEVICE.sub("", code)):
                continue
            tags = [m.group(1) for j in range(max(0, i - 4), i) if (m := TAG.search(lines[j]))]
            places.append((str(path.relative_to(ROOT)), i, line.strip(), tags[-1] if tags else None))
    return places


def forced_tags() -> dict[str, list[str]]:
    """tag -> the tests that force it, from `device_branch("a", "b")` markers in tests/."""
    forced: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                    == "device_branch":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        forced.setdefault(arg.value, []).append(path.name)
    return forced


def test_every_device_dependent_line_is_tagged():
    untagged = [f"{f}:{n}: {line}" for f, n, line, tag in device_places() if tag is None]
    assert not untagged, "device-dependent code without a `# device-branch: NAME` tag:\n" + "\n".join(untagged)


def test_every_tag_is_forced_by_a_cpu_test():
    tags = {tag for *_, tag in device_places() if tag}
    forced = forced_tags()
    missing = sorted(tags - forced.keys())
    assert not missing, f"device branches no test forces (mark one with @pytest.mark.device_branch): {missing}"
    stale = sorted(forced.keys() - tags)
    assert not stale, f"tests force device branches the source no longer tags: {stale}"


def test_docs_list_every_device_branch():
    doc = (ROOT / "docs" / "scale.md").read_text()
    tags = {tag for *_, tag in device_places() if tag}
    listed = set(re.findall(r"^\| `([a-z0-9_./-]+)` \|", doc, flags=re.M))
    assert tags <= listed, f"docs/scale.md's device-branch table lacks {sorted(tags - listed)}"
    assert listed <= tags, f"docs/scale.md lists device branches the source no longer has: {sorted(listed - tags)}"


def test_the_inventory_finds_what_it_should():
    """The scanner itself: it sees a cuda call, skips docstrings and comments, and reads a tag above a line."""
    places = {(f, line) for f, _, line, _ in device_places()}
    assert any("torch.cuda.is_available()" in line for _, line in places)
    assert not any(line.startswith("#") for _, line in places)
    assert TAG.search("    # device-branch: decode/attention-kernel").group(1) == "decode/attention-kernel"
