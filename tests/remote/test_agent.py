"""The host's half (`onetrainer/remote/agent.py`) without SSH: a detached run's end action runs only when no one
follows the run (the follower then downloads first and acts itself)."""

from __future__ import annotations

import json
import os
import shlex
import time

from onetrainer.remote.agent import FOLLOWER_SECONDS, run_end_action
from onetrainer.remote.providers import LinuxProvider
from onetrainer.remote.runpod import RunPodProvider
from onetrainer.remote.settings import CloudSecrets, CloudSettings
from onetrainer.training.events import ListSink, Warning_


def test_the_end_action_runs_unless_a_follower_is_there(tmp_path):
    done, failed = tmp_path / "finished-action", tmp_path / "failed-action"
    actions = {"finished": f"touch {shlex.quote(str(done))}", "failed": f"touch {shlex.quote(str(failed))}"}
    (tmp_path / "on_end.json").write_text(json.dumps(actions), encoding="utf-8")
    follower = tmp_path / "follower"
    follower.touch()
    assert run_end_action(tmp_path, failed=False) is None and not done.exists()
    old = time.time() - FOLLOWER_SECONDS - 5
    os.utime(follower, (old, old))  # the follower went away a while ago
    assert run_end_action(tmp_path, failed=False) == actions["finished"] and done.exists()
    assert run_end_action(tmp_path, failed=True) == actions["failed"] and failed.exists()


def test_each_provider_s_detached_command():
    settings = CloudSettings.from_dict({"type": "RUNPOD", "create": False})
    runpod = RunPodProvider(settings, CloudSecrets(api_key="k", id="pod1"))
    events = ListSink()
    assert 'runpodctl stop pod "$RUNPOD_POD_ID"' in runpod.detached_command("STOP", events, "cloud.on_detached_finish")
    assert "runpodctl remove pod" in runpod.detached_command("DELETE", events, "cloud.on_detached_error")
    assert runpod.detached_command("NONE", events, "cloud.on_detached_error") is None
    linux = LinuxProvider(CloudSettings(), CloudSecrets(host="h"))
    assert linux.detached_command("STOP", events, "cloud.on_detached_finish") is None
    assert "a LINUX host is the user's machine" in events.of(Warning_)[0].text
