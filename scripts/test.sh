#!/usr/bin/env bash
# Lint and test OneTrainer: ruff check, ruff format --check, then pytest (arguments go to pytest).
# Works from any directory; installs into .venv with the dev tools on first use (./install.sh --dev).
#
#   ./scripts/test.sh                  # everything
#   ./scripts/test.sh -k config -x     # a subset, stop at the first failure
#   ./scripts/test.sh -n 0 tests/data  # in one process (two by default, see below)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VPY=.venv/bin/python
STAMP=.venv/.onetrainer-install-stamp

if [ ! -x "$VPY" ] || [ ! -x .venv/bin/ruff ] || ! "$VPY" -c "import onetrainer, pytest, xdist" >/dev/null 2>&1 ||
    [ pyproject.toml -nt "$STAMP" ]; then
    ./install.sh --dev
fi

failed=()
echo "==> ruff check ."
.venv/bin/ruff check . || failed+=("ruff check")
echo "==> ruff format --check ."
.venv/bin/ruff format --check . || failed+=("ruff format --check (fix with: .venv/bin/ruff format .)")
# Two test processes (pytest-xdist) where there are two cores or more, each test file whole in one of them (its
# module-scoped fixtures are built once): the suite takes a little over half the time. -n N chooses; -n 0: one process.
parallel=(-n 2 --dist loadfile)
[ "$("$VPY" -c 'import os; print(os.cpu_count() or 1)')" -ge 2 ] || parallel=()
for arg in "$@"; do
    case "$arg" in
        -n | -n[0-9]* | --numprocesses | --numprocesses=* | no:xdist | -pno:xdist) parallel=() ;;
    esac
done
echo "==> pytest ${parallel[*]+${parallel[*]} }$*"
"$VPY" -m pytest ${parallel[@]+"${parallel[@]}"} "$@" || failed+=("pytest")

if [ ${#failed[@]} -gt 0 ]; then
    echo >&2
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo
echo "All checks passed."
