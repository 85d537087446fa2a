"""A window's process that ends while a background job computes with torch exits cleanly: without waiting for the job
(`gui.background.wait_for_jobs` at exit), torch's thread pool is torn down under the worker and the process aborts
("terminate called without an active exception"), as a GUI test file once did after all its tests passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import time, tkinter, torch
from gui.background import run_in_background

def work():
    a = torch.randn(1200, 1200)
    for _ in range(60):
        a = a @ a.T / 1200
    return float(a.sum())

root = tkinter.Tk()
run_in_background(root, work, lambda result: None)
time.sleep(0.3)  # the worker is inside torch's matrix products when the script ends
print("ending")
"""


def test_a_process_ending_during_a_torch_job_waits_for_it_and_exits_cleanly(display) -> None:
    environment = {**os.environ, "DISPLAY": display, "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0 and "ending" in done.stdout, done.stdout + done.stderr
        assert "terminate called" not in done.stderr
