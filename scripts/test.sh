#!/usr/bin/env bash
# Lint and test OneTrainer: ruff check, ruff format --check, then pytest (arguments go to pytest).
# Works from any directory; installs into .venv with the dev tools on first use (./install.sh --dev).
#
#   ./scripts/test.sh                  # everything
#   ./scripts/test.sh -k config -x     # a subset, stop at the first failure
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VPY=.venv/bin/python
STAMP=.venv/.onetrainer-install-stamp

if [ ! -x "$VPY" ] || [ ! -x .venv/bin/ruff ] || ! "$VPY" -c "import onetrainer, pytest" >/dev/null 2>&1 ||
    [ pyproject.toml -nt "$STAMP" ]; then
    ./install.sh --dev
fi

failed=()
echo "==> ruff check ."
.venv/bin/ruff check . || failed+=("ruff check")
echo "==> ruff format --check ."
.venv/bin/ruff format --check . || failed+=("ruff format --check (fix with: .venv/bin/ruff format .)")
echo "==> pytest $*"
"$VPY" -m pytest "$@" || failed+=("pytest")

if [ ${#failed[@]} -gt 0 ]; then
    echo >&2
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo
echo "All checks passed."
