"""Open a URL in a web browser, and know whether one really opened (the TensorBoard button's message depends on it).

`webbrowser.open` answers True as soon as it has started a desktop launcher (xdg-open, gio): the launcher looks for a
browser afterwards, in the background, and fails there when there is none (a server, a container, a bare desktop).
Here a launcher is run and waited for a moment: it fails within that moment when it finds no browser; one that is
still running, or has exited with 0, has started one.
"""

from __future__ import annotations

import os
import subprocess
import webbrowser

# Desktop launchers that hand the URL to the user's default browser (and exit non-zero when there is none).
LAUNCHERS = frozenset({"xdg-open", "gio", "gvfs-open", "kde-open", "kde-open5", "exo-open", "open"})
LAUNCHER_WAIT_S = 2.0


def open_in_browser(url: str) -> bool:
    """Open `url` in a web browser; True only when one was started (False: tell the user to open the URL)."""
    try:
        controller = webbrowser.get()
    except webbrowser.Error:  # no browser registered at all
        return False
    if isinstance(controller, webbrowser.GenericBrowser) and controller.basename in LAUNCHERS:
        return _launch(controller, url)
    if type(controller) is webbrowser.GenericBrowser:
        # A text-mode browser (lynx, w3m, www-browser) would take over the terminal the app was started from.
        return False
    try:
        return bool(controller.open(url))
    except Exception:  # webbrowser.Error, or OSError from a broken launcher
        return False


def _launch(controller: webbrowser.GenericBrowser, url: str) -> bool:
    command = [controller.name, *(arg.replace("%s", url) for arg in controller.args)]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=os.name != "nt",  # the browser outlives the app
        )
    except OSError:
        return False
    try:
        return process.wait(LAUNCHER_WAIT_S) == 0
    except subprocess.TimeoutExpired:
        return True  # still running: it started the browser and waits for it
