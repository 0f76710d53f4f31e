"""How the command-line entry points (train.py, eval.py) end on a user's mistake.

A bad option, a malformed data row, a missing file or model folder is the user's to fix, not a bug: it is
printed as one line that names the key, row or path and the fix, and the process exits with status 2 (as
argparse does for a bad option), without a traceback. Every other exception is a bug in minirl or below it
and keeps its full traceback.
"""
from __future__ import annotations

import sys
from typing import Callable, TypeVar

from minirl.config import ConfigError
from minirl.data import DataError

T = TypeVar("T")
USER_ERRORS = (ConfigError, DataError)  # policy.ModelNotFoundError is a ConfigError: a bad model_name_or_path


def exit_on_user_error(main: Callable[[], T]) -> T:
    """Run `main()`; on a user error print `error: <message>` to stderr and exit with status 2."""
    try:
        return main()
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
