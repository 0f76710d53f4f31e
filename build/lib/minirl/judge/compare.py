"""How a program's output is compared with the expected one: token by token, as bytes, never decoded.

    outputs_match(b"1 2\\n3 ", "1 2 3")                             # True: whitespace-insensitive
    outputs_match(b"0.3333", "0.333333", float_tolerance=1e-3)        # True: numeric tokens within tolerance
    output_file_matches(path, expected, float_tolerance)              # a run's output file, mapped, not read

What it leaves out: a special checker (a program of the problem's, minirl/judge/verdict.py: `_check`) decides
problems with many right answers.
"""
from __future__ import annotations

import math
import mmap
import os
import re
from pathlib import Path

_TOKEN = re.compile(rb"\S+")       # bytes.split()'s whitespace: space, \t, \n, \r, \v, \f


def outputs_match(actual: bytes | str | mmap.mmap, expected: str, float_tolerance: float | None = None) -> bool:
    """Token-wise and whitespace-insensitive, on bytes; stops at the first mismatch or the first token past the
    expected ones, so 64 MiB of garbage costs one token. With a tolerance, numeric tokens match if both are
    finite and |a-b| <= tol*max(1,|b|) (an expected "inf" must then be printed as the same token)."""
    want = expected.encode().split()
    actual = actual.encode() if isinstance(actual, str) else actual
    n = 0
    for m in _TOKEN.finditer(actual):
        if n == len(want):
            return False
        x, y = m.group(), want[n]
        n += 1
        if x != y and not (float_tolerance is not None and _close(x, y, float_tolerance)):
            return False
    return n == len(want)


def _close(x: bytes, y: bytes, tol: float) -> bool:
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return False
    return math.isfinite(fx) and math.isfinite(fy) and abs(fx - fy) <= tol * max(1.0, abs(fy))


def output_file_matches(path: Path, expected: str, float_tolerance: float | None) -> bool:
    """The program's output file against the expected text, mapped rather than read (never decoded)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return outputs_match(b"", expected, float_tolerance)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return outputs_match(data, expected, float_tolerance)
