#!/usr/bin/env bash
# A newcomer's check: clone this checkout into a temporary folder and run the README's two commands there as
# on a fresh machine (a fresh HOME, so no pip, Hugging Face or minirl cache; `make test` makes its own empty
# caches), then print the toy run's before/after and the test summary.
#   scripts/fresh_check.sh              # both commands (~15 min on 2 cores)
#   scripts/fresh_check.sh demo         # only `make demo`
# The clone is of the committed HEAD: commit first. ../shared (the real data the tests read) is linked beside it.
set -euo pipefail
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
what=${1:-all}
# Not under /tmp when root: the judge refuses a root cache under a world-writable folder (judge/host.py)
if [ "$(id -u)" = 0 ]; then tmp=$(mktemp -d /var/lib/minirl-fresh.XXXXXX); else tmp=$(mktemp -d); fi
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
git clone -q "$src" "$tmp/minirl"
[ -d "$src/../shared" ] && ln -s "$(cd "$src/../shared" && pwd)" "$tmp/shared"
mkdir "$tmp/home"
cd "$tmp/minirl"
echo "[fresh_check] $(git log --oneline -1) in $tmp/minirl, HOME=$tmp/home"
run() {  # a command with a fresh HOME, the caches inside it
    env HOME="$tmp/home" MINIRL_CACHE="$tmp/home/.cache/minirl" PIP_CACHE_DIR="$tmp/home/.cache/pip" "$@"
}
set +e
start=$(date +%s)
run make demo > "$tmp/demo.log" 2>&1
rc=$?
grep -E "held-out accuracy|Error" "$tmp/demo.log"; [ $rc = 0 ] || tail -20 "$tmp/demo.log"
echo "[fresh_check] make demo: exit $rc, $(( $(date +%s) - start )) s (setup included)"
if [ "$what" = all ]; then
    start=$(date +%s)
    run make test > "$tmp/test.log" 2>&1
    rc=$?
    tail -3 "$tmp/test.log"
    echo "[fresh_check] make test: exit $rc, $(( $(date +%s) - start )) s"
fi
set -e
echo "[fresh_check] written into the checkout: $(git status --porcelain --ignored | grep -v -e '\.venv/$' -e '__pycache__/$' -e '\.egg-info/$' | tr '\n' ' ')"
echo "[fresh_check] written into HOME: $(cd "$tmp/home" && find . -mindepth 2 -maxdepth 2 | sort | tr '\n' ' ')"
