"""Small helpers for driving the real widgets in the GUI tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def view_of(app, tab: str, path: str):
    """The field view of `path` on `tab` (the tab is selected), asserting it is shown."""
    view = app.select_tab(tab).form.view(path)
    assert view is not None and view.visible, f"{path} is not shown on the {tab} tab"
    return view


def choose_in_menu(menu, label: str) -> None:
    """Pick an entry of a CTkOptionMenu as a click in its dropdown does."""
    assert label in menu.cget("values"), (label, menu.cget("values"))
    menu._dropdown_callback(label)


def pump(widget, until: Callable[[], bool], timeout: float = 120.0) -> None:
    """Run the Tk loop until `until()` holds (`after` callbacks included). `timeout` only ends a wait that would never
    end: generous, as a busy machine may take long (it returns as soon as `until()` holds)."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the window")
        widget.update()
        time.sleep(0.005)


def settle(widget, seconds: float = 0.3) -> None:
    """Let pending `after` callbacks (debounced redraws) run."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        widget.update()
        time.sleep(0.01)


def drag(canvas, button: int, points: list[tuple[int, int]]) -> None:
    """A pointer drag on a canvas with synthetic events: press at the first point, move through the rest, release."""
    motion_state = {1: 0x100, 3: 0x400}[button]  # Button1Mask / Button3Mask: what makes <Motion> a <B1-Motion>
    (x, y), rest = points[0], points[1:]
    canvas.event_generate(f"<ButtonPress-{button}>", x=x, y=y)
    for x, y in rest:
        canvas.event_generate("<Motion>", x=x, y=y, state=motion_state)
    canvas.event_generate(f"<ButtonRelease-{button}>", x=x, y=y, state=motion_state)
    canvas.update()


def press(widget, *sequences: str) -> None:
    """Key events as typed into `widget`: Tk delivers key events to the focus window, so it takes the focus first."""
    widget.focus_force()
    widget.update()
    for sequence in sequences:
        widget.event_generate(sequence)
    widget.update()
