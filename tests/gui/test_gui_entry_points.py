"""The ways to open the app: scripts/train_ui.py, `python -m gui`, gui.app.main (no display needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gui.app import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_help_and_arguments() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    args = build_parser().parse_args(["--preset", "sd15/lora", "--appearance", "light"])
    assert (args.preset, args.config_path, args.appearance) == ("sd15/lora", None, "light")


def test_a_missing_config_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-path", "/no/such/config.json"]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["script", "module"])
def test_without_a_display_the_app_says_so(how: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    env["ONETRAINER_STATE_DIR"] = str(tmp_path)
    # The script works from any folder (it finds the checkout itself); `-m gui` runs from the checkout.
    command, cwd = ([str(ROOT / "scripts" / "train_ui.py")], tmp_path) if how == "script" else (["-m", "gui"], ROOT)
    result = subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot open a window" in result.stderr
