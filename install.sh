#!/usr/bin/env bash
# Install OneTrainer into .venv (Linux / macOS).
#
#   ./install.sh          # the app
#   ./install.sh --dev    # the app plus the test tools (pytest, ruff)
#
# Environment: PYTHON=/path/to/python3.x picks the interpreter (3.10 to 3.13);
# ONETRAINER_TORCH=cpu|cuda|cu128... and ONETRAINER_TORCH_INDEX=URL override the torch build
# (see scripts/install_torch.py). Safe to run again: it only installs what is missing or changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

DEV=0
for arg in "$@"; do
    case "$arg" in
        --dev) DEV=1 ;;
        -h | --help)
            sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "install.sh: unknown option '$arg' (use --dev or --help)" >&2
            exit 2
            ;;
    esac
done

VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.onetrainer-install-stamp"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# dadaptation ships only a source archive whose setup.py still names its license by classifier; building its wheel
# makes setuptools print a deprecation box ("!! … License classifiers are deprecated … !!") that is the package's
# business, not the user's. The editable install of OneTrainer itself makes setuptools print another box, which pip
# shows as "BuildBackendWarning: Editable installation. … folders in your working directory with the same name as
# your package …": the clone is meant to be that folder. Only those two warnings are ignored (pip's build processes
# inherit the filter).
export PYTHONWARNINGS="ignore:License classifiers are deprecated,ignore:Editable installation"

say() { printf '==> %s\n' "$*"; }
die() {
    printf '\nERROR: %s\n' "$*" >&2
    exit 1
}
# pip's stdout without the lines that only say "nothing to do" or echo the build backend: what is downloaded and
# installed stays. pip reports warnings and errors (build failures included) on stderr, which is not filtered,
# except for one harmless warning that a pip.conf naming an absent local index triggers for every package.
quiet_pip() {
    local line
    while IFS= read -r line; do
        case "$line" in
            "Requirement already satisfied"* | "Looking in indexes"* | "Looking in links"*) ;;
            "  Downloading "* | "  Building wheel for "*"finished"*) printf '%s\n' "$line" ;;
            " "*) ;; # indented: cache hits, build-backend chatter, progress bars, uninstall details
            "") ;;
            *) printf '%s\n' "$line" ;;
        esac
    done
}
quiet_pip_stderr() {
    local line
    while IFS= read -r line; do
        case "$line" in
            "WARNING: Location '"*"' is ignored: it is neither a file nor a directory.") ;;
            *) printf '%s\n' "$line" >&2 ;;
        esac
    done
}
pip_install() { "$VPY" -m pip install "$@" 2> >(quiet_pip_stderr) | quiet_pip; }

PY_CHECK='import sys; v = sys.version_info[:2]; print("%d.%d" % v); sys.exit(0 if (3, 10) <= v < (3, 14) else 1)'

# --- 1. the interpreter and the virtual environment -------------------------------------------------------
if [ -x "$VPY" ] && "$VPY" -c "$PY_CHECK" >/dev/null 2>&1; then
    say "Using the existing virtual environment .venv (Python $("$VPY" -c "$PY_CHECK"))"
else
    if [ -e "$VENV" ]; then
        if [ -x "$VPY" ]; then
            have="$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo broken)"
            die ".venv uses Python $have; OneTrainer needs 3.10 to 3.13. Remove it (rm -rf .venv) and run ./install.sh again."
        fi
        die ".venv exists but has no working bin/python. Remove it (rm -rf .venv) and run ./install.sh again."
    fi
    PY=""
    if [ -n "${PYTHON:-}" ]; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON: no such command."
        ver="$("$PYTHON" -c "$PY_CHECK" 2>/dev/null)" ||
            die "PYTHON=$PYTHON is Python ${ver:-?}; OneTrainer needs Python 3.10 to 3.13."
        PY="$PYTHON"
    else
        for cand in python3 python3.13 python3.12 python3.11 python3.10 python; do
            if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$PY_CHECK" >/dev/null 2>&1; then
                PY="$cand"
                break
            fi
        done
        [ -n "$PY" ] || die "No Python 3.10 to 3.13 found (tried python3, python3.13 ... python3.10, python).
       Install one (Debian/Ubuntu: sudo apt install python3 python3-venv python3-tk;
       macOS: brew install python@3.12 python-tk@3.12), or point PYTHON=/path/to/python3.x at one."
    fi
    say "Creating the virtual environment .venv with $("$PY" -c 'import sys; print(sys.executable)') (Python $("$PY" -c "$PY_CHECK"))"
    if ! "$PY" -m venv "$VENV"; then
        rm -rf "$VENV"
        die "'$PY -m venv' failed. On Debian/Ubuntu install the venv module: sudo apt install python3-venv"
    fi
    say "Upgrading pip"
    pip_install --quiet --upgrade pip || die "upgrading pip in .venv failed (see pip's error above)."
fi

"$VPY" -c "import tkinter" >/dev/null 2>&1 || printf '%s\n' \
    "WARNING: this Python has no tkinter, so the app (./start-ui.sh) cannot open its window; training and" \
    "         tests without the GUI still work. Install Tk (Debian/Ubuntu: sudo apt install python3-tk;" \
    "         macOS: brew install python-tk@3.12) or use a Python built with it, then rm -rf .venv and reinstall." >&2

# --- 2. torch, pinned, CUDA or CPU build as fits this machine ----------------------------------------------
say "Checking torch"
"$VPY" scripts/install_torch.py --python "$VPY" 2> >(quiet_pip_stderr) | quiet_pip ||
    die "installing torch failed (see above). Override with ONETRAINER_TORCH=cpu|cuda or ONETRAINER_TORCH_INDEX=URL."

# --- 3. OneTrainer (editable) and its other dependencies ---------------------------------------------------
if [ "$DEV" = 1 ]; then TARGET=".[dev]" EXTRAS="dev"; else TARGET="." EXTRAS="base"; fi
WANT="$("$VPY" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())') $ROOT"
# Whether onetrainer imports from this checkout and every requirement it declares (with the dev extra when asked)
# is installed; names only, versions are pip's business when something changed.
CHECK_INSTALLED='
import importlib.metadata as md, os, re, sys
import onetrainer
here = os.path.realpath(onetrainer.__file__)
if not here.startswith(os.path.join(os.path.realpath(sys.argv[1]), "")):
    sys.exit("onetrainer is installed from elsewhere: " + here)
for req in md.requires("onetrainer") or []:
    extra = re.search(r"extra\s*==\s*.([\w.-]+)", req)
    if extra and extra.group(1) not in sys.argv[2:]:
        continue
    md.version(re.match(r"[A-Za-z0-9._-]+", req).group(0))
'
installed_ok() {
    # the stamp matches pyproject.toml (and the extras), and the installation is complete
    [ -f "$STAMP" ] || return 1
    local have
    have="$(head -n 1 "$STAMP")"
    [ "$have" = "$WANT dev" ] || { [ "$EXTRAS" = base ] && [ "$have" = "$WANT base" ]; } || return 1
    (cd / && "$VPY" -c "$CHECK_INSTALLED" "$ROOT" "$EXTRAS") >/dev/null 2>&1
}
if installed_ok; then
    say "OneTrainer and its dependencies are up to date"
else
    if [ "$DEV" = 1 ]; then
        say "Installing OneTrainer (editable) with its dependencies and the dev tools (pytest, ruff)"
    else
        say "Installing OneTrainer (editable) with its dependencies"
    fi
    pip_install -e "$TARGET" || die "pip install -e '$TARGET' failed (see pip's error above)."
    # a plain install keeps dev tools installed earlier: record "dev" then, so that --dev need not reinstall
    if [ "$EXTRAS" = base ] && (cd / && "$VPY" -c "$CHECK_INSTALLED" "$ROOT" dev) >/dev/null 2>&1; then EXTRAS=dev; fi
    printf '%s %s\n' "$WANT" "$EXTRAS" >"$STAMP"
fi

# --- 4. what next --------------------------------------------------------------------------------------------
# start-ui.sh runs this installer on first use and then starts the app itself (it sets ONETRAINER_STARTING_APP).
if [ "${ONETRAINER_STARTING_APP:-}" = 1 ]; then
    say "Done. Starting the app…"
else
    say "Done. Start the app: ./start-ui.sh    Run the tests: ./scripts/test.sh"
fi
