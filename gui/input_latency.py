"""How long the window takes to answer real input while training: key presses and tab clicks sent through the X server.

The events are made with the XTEST extension (what xdotool uses), from a thread of this process, so the time each one
reached the X server is known to the microsecond (after `XSync`). The app's answer is timed by a binding on the main
window, which runs after the widget's own handlers, and an idle callback it schedules: the time the window was done
with the event and its redraw. `busy` processes spinning beside it stand for a machine loaded by other work.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gui.latency import percentile

KEY_GAP_S = 0.3
CLICK_GAP_S = 0.6


@dataclass(frozen=True)
class InputReport:
    kind: str
    sent: int
    answered: int  # the others were lost: no handler ran for them before the end
    p50_ms: float
    p95_ms: float
    max_ms: float

    def text(self) -> str:
        lost = f", {self.sent - self.answered} lost" if self.answered < self.sent else ""
        return (
            f"{self.kind}: {self.answered} of {self.sent} answered{lost}; "
            f"p50 {self.p50_ms:.0f} ms, p95 {self.p95_ms:.0f} ms, max {self.max_ms:.0f} ms"
        )


def report(kind: str, sent: list[float], answered: list[float]) -> InputReport:
    """Latencies of the `answered` times against the `sent` ones, in order (an event answered before the sender saw
    its `XSync` return counts as 0)."""
    latencies = [max(0.0, (a - s) * 1000) for s, a in zip(sent, answered, strict=False)]
    return InputReport(
        kind,
        len(sent),
        len(answered),
        statistics.median(latencies) if latencies else 0.0,
        percentile(latencies, 0.95),
        max(latencies, default=0.0),
    )


class XInput:
    """Key presses and clicks through XTEST on $DISPLAY (libX11 and libXtst, loaded with ctypes)."""

    def __init__(self) -> None:
        x11_name, xtst_name = ctypes.util.find_library("X11"), ctypes.util.find_library("Xtst")
        if not x11_name or not xtst_name:
            raise OSError("libX11 and libXtst are needed to send input (apt-get install libxtst6)")
        self.x11, self.xtst = ctypes.CDLL(x11_name), ctypes.CDLL(xtst_name)
        display, ulong, uint, int_ = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_uint, ctypes.c_int
        self.x11.XOpenDisplay.restype, self.x11.XOpenDisplay.argtypes = display, [ctypes.c_char_p]
        self.x11.XSync.argtypes = [display, int_]
        self.x11.XCloseDisplay.argtypes = [display]
        self.x11.XStringToKeysym.restype, self.x11.XStringToKeysym.argtypes = ulong, [ctypes.c_char_p]
        self.x11.XKeysymToKeycode.restype, self.x11.XKeysymToKeycode.argtypes = ctypes.c_ubyte, [display, ulong]
        self.xtst.XTestFakeKeyEvent.argtypes = [display, uint, int_, ulong]
        self.xtst.XTestFakeButtonEvent.argtypes = [display, uint, int_, ulong]
        self.xtst.XTestFakeMotionEvent.argtypes = [display, int_, int_, int_, ulong]
        self.display = self.x11.XOpenDisplay(None)
        if not self.display:
            raise OSError("cannot open the X display")

    def key(self, name: str) -> float:
        """Press and release key `name` (an X keysym name: "1", "BackSpace"); the time the press reached the server."""
        code = self.x11.XKeysymToKeycode(self.display, self.x11.XStringToKeysym(name.encode()))
        self.xtst.XTestFakeKeyEvent(self.display, code, 1, 0)
        self.x11.XSync(self.display, 0)
        sent = time.monotonic()
        self.xtst.XTestFakeKeyEvent(self.display, code, 0, 0)
        self.x11.XSync(self.display, 0)
        return sent

    def click(self, x: int, y: int) -> float:
        """Move to (x, y) on the screen and click the first button; the time the release reached the server."""
        self.xtst.XTestFakeMotionEvent(self.display, -1, x, y, 0)
        self.xtst.XTestFakeButtonEvent(self.display, 1, 1, 0)
        self.x11.XSync(self.display, 0)
        self.xtst.XTestFakeButtonEvent(self.display, 1, 0, 0)
        self.x11.XSync(self.display, 0)
        return time.monotonic()

    def close(self) -> None:
        self.x11.XCloseDisplay(self.display)


def centre(widget: Any) -> tuple[int, int]:
    return widget.winfo_rootx() + widget.winfo_width() // 2, widget.winfo_rooty() + widget.winfo_height() // 2


class AnswerClock:
    """The times the app was done with each key press and each click (release) on its window, the redraw included."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.answered: dict[str, list[float]] = {}
        self.counting: str | None = None  # which kind is measured now (the set-up's own clicks are not)
        self._ids = [
            ("<KeyPress>", root.bind("<KeyPress>", lambda _e: self._heard(), add="+")),
            ("<ButtonRelease-1>", root.bind("<ButtonRelease-1>", lambda _e: self._heard(), add="+")),
        ]

    def _heard(self) -> None:
        kind = self.counting
        if kind is not None:
            self.root.after_idle(lambda: self.answered.setdefault(kind, []).append(time.monotonic()))

    def close(self) -> None:
        for sequence, funcid in self._ids:
            self.root.unbind(sequence, funcid)


def measure_input_latency(
    app: Any, keys: int = 20, clicks: int = 20, training: Callable[[], bool] | None = None
) -> list[InputReport]:
    """Click Start, then (once `training()` holds) type `keys` keys into the Epochs field (alternately "1" and
    BackSpace) and click `clicks` times through the tabs (each in turn), as a user would, while `app`'s main loop
    runs; report how long the window took to answer each kind. Without `training`, Start is not clicked."""
    field = app.select_tab("training").form.view("epochs")
    app.update()
    bar = app.tabview.bar
    start_at, field_at = centre(app.footer.start_button), centre(field.entry)
    tabs = [centre(bar._buttons_dict[title]) for title in bar._value_list if title != "training"]
    clock = AnswerClock(app)
    sent: dict[str, list[float]] = {}
    finished = threading.Event()
    failure: list[BaseException] = []

    def count(kind: str, when: float) -> None:
        sent.setdefault(kind, []).append(when)

    def send() -> None:
        x = XInput()
        try:
            if training is not None:
                clock.counting = "click on Start"
                count("click on Start", x.click(*start_at))
                deadline = time.monotonic() + 300
                while not training() and time.monotonic() < deadline:
                    time.sleep(0.1)
            clock.counting = None
            x.click(*field_at)
            time.sleep(0.5)
            x.key("End")
            time.sleep(0.3)
            clock.counting = "key press in the Epochs field"
            for i in range(keys):
                count(clock.counting, x.key("1" if i % 2 == 0 else "BackSpace"))
                time.sleep(KEY_GAP_S)
            time.sleep(1.0)
            clock.counting = "click on a tab"
            for i in range(clicks):
                count(clock.counting, x.click(*tabs[i % len(tabs)]))
                time.sleep(CLICK_GAP_S)
            time.sleep(1.0)
        except BaseException as e:  # raised on the Tk thread
            failure.append(e)
        finally:
            x.close()
            finished.set()

    def check(deadline: float) -> None:
        answered_all = all(len(clock.answered.get(k, [])) >= len(v) for k, v in sent.items())
        if finished.is_set() and (answered_all or time.monotonic() > deadline):
            app.quit()
        else:
            app.after(50, check, deadline)

    threading.Thread(target=send, name="input-sender", daemon=True).start()
    app.after(50, check, time.monotonic() + 360 + keys * KEY_GAP_S + clicks * CLICK_GAP_S)
    try:
        app.mainloop()
    finally:
        clock.close()
    if failure:
        raise failure[0]
    return [report(kind, times, clock.answered.get(kind, [])) for kind, times in sent.items()]


def spin(count: int) -> list[subprocess.Popen]:
    """`count` processes that keep a core busy each (a machine loaded by other work); end them with `stop_spinning`."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_spinning(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()
