#!/usr/bin/env bash
# Run a command with fresh, empty caches, as on a newcomer's machine, and remove them afterwards:
#   scripts/with_empty_caches.sh .venv/bin/python -m pytest -q tests      (what `make test` runs)
# Every cache minirl writes has its own variable (docs/tests.md): the built-in models (MINIRL_CACHE), the
# judge's binaries, PCH and run folders (MINIRL_JUDGE_CACHE), tinker:// checkpoints (MINIRL_SESSIONS_DIR), and
# the libraries' own (HF_HOME for datasets, XDG_CACHE_HOME, MPLCONFIGDIR). So no build path can be skipped
# because an older run left its result behind. Keep a warm cache between runs with KEEP_CACHES=1.
set -euo pipefail
if [ "${KEEP_CACHES:-0}" = 1 ]; then exec "$@"; fi
# The judge refuses a cache of root's under a world-writable folder such as /tmp (judge/host.py), and its
# sandboxed programs must be able to pass through the folders above their own (hence 0755).
if [ "$(id -u)" = 0 ]; then base=$(mktemp -d /var/lib/minirl-cold.XXXXXX); else base=$(mktemp -d); fi
chmod 755 "$base"
trap 'rm -rf "$base"' EXIT
export MINIRL_CACHE=$base/minirl MINIRL_JUDGE_CACHE=$base/judge MINIRL_SESSIONS_DIR=$base/sessions \
       HF_HOME=$base/huggingface XDG_CACHE_HOME=$base/xdg MPLCONFIGDIR=$base/matplotlib
echo "[minirl] empty caches under $base"
"$@"
