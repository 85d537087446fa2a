#!/usr/bin/env bash
# Open the OneTrainer app (Linux / macOS). Installs it into .venv first when needed (./install.sh).
# Arguments are passed to scripts/train_ui.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VPY="$ROOT/.venv/bin/python"

# The app runs from the repository root (its workspace and presets are relative to it), so arguments that
# name existing files or folders are made absolute first.
args=()
for arg in "$@"; do
    if [ -e "$arg" ]; then
        arg="$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg")"
    fi
    args+=("$arg")
done
cd "$ROOT"

app_imports() { [ -x "$VPY" ] && "$VPY" -c "import onetrainer, customtkinter" >/dev/null 2>&1; }

if ! app_imports; then
    echo "==> OneTrainer is not installed yet (or incompletely): running ./install.sh"
    ONETRAINER_STARTING_APP=1 ./install.sh
    if ! app_imports; then
        echo >&2
        echo "ERROR: the app still does not import after installing:" >&2
        "$VPY" -c "import onetrainer, customtkinter" || true
        echo "If the error is about tkinter: install Tk (Debian/Ubuntu: sudo apt install python3-tk;" >&2
        echo "macOS: brew install python-tk@3.12), then rm -rf .venv and run ./start-ui.sh again." >&2
        exit 1
    fi
fi

exec "$VPY" scripts/train_ui.py ${args[@]+"${args[@]}"}
