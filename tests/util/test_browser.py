"""TensorBoard's button says it opened a browser only when one was opened: a desktop launcher that finds no browser
(xdg-open on a machine without one) is not taken for a browser, as `webbrowser.open` takes it."""

from __future__ import annotations

import inspect
import stat
import sys
import webbrowser
from pathlib import Path

import pytest

from onetrainer.util import browser
from onetrainer.util.browser import open_in_browser

URL = "http://localhost:6006/"


def launcher(tmp_path: Path, name: str, exit_code: int, sleep_s: float = 0.0) -> Path:
    """A stand-in for xdg-open: records the URL it was given, then exits with `exit_code` (3: no browser found)."""
    script = tmp_path / name
    log = tmp_path / f"{name}.log"
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\nopen({str(log)!r}, 'w').write(sys.argv[-1])\n"
        f"time.sleep({sleep_s})\nsys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def registered(monkeypatch):
    def use(controller) -> None:
        monkeypatch.setattr(webbrowser, "get", lambda using=None: controller)

    return use


@pytest.mark.skipif(sys.platform == "win32", reason="a launcher script needs a POSIX shebang")
def test_a_launcher_that_finds_no_browser_is_not_an_opened_browser(tmp_path, registered, monkeypatch):
    # Waited for until it ends (it ends at once): a busy machine may take seconds to start a Python script.
    monkeypatch.setattr(browser, "LAUNCHER_WAIT_S", 120.0)
    script = launcher(tmp_path, "xdg-open", exit_code=3)
    registered(webbrowser.BackgroundBrowser(str(script)))
    assert webbrowser.get().open(URL) is True  # what the app used to believe
    assert open_in_browser(URL) is False
    assert (tmp_path / "xdg-open.log").read_text() == URL


@pytest.mark.skipif(sys.platform == "win32", reason="a launcher script needs a POSIX shebang")
@pytest.mark.parametrize(("exit_code", "sleep_s"), [(0, 0.0), (0, 5.0)], ids=["exits-0", "still-running"])
def test_a_launcher_that_started_a_browser_is_an_opened_browser(tmp_path, registered, monkeypatch, exit_code, sleep_s):
    monkeypatch.setattr(browser, "LAUNCHER_WAIT_S", 0.5)
    registered(webbrowser.BackgroundBrowser([str(launcher(tmp_path, "gio", exit_code, sleep_s)), "open", "%s"]))
    assert open_in_browser(URL) is True


def test_no_browser_at_all_or_a_text_browser_is_not_opened(registered, monkeypatch):
    def none(using=None):
        raise webbrowser.Error("could not locate runnable browser")

    monkeypatch.setattr(webbrowser, "get", none)
    assert open_in_browser(URL) is False
    registered(webbrowser.GenericBrowser("lynx"))  # it would take over the terminal: never started
    monkeypatch.setattr(webbrowser.GenericBrowser, "open", lambda *a, **k: pytest.fail("must not start lynx"))
    assert open_in_browser(URL) is False


def test_the_app_opens_tensorboard_through_it():
    from gui.app import App

    assert inspect.signature(App.__init__).parameters["open_url"].default is open_in_browser
