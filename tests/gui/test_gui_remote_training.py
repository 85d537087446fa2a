"""The app's Start with a config whose `cloud` block is enabled trains on the SSH host (tests/remote's loopback sshd):
the footer follows the remote run's steps and loss, and its outputs land where the config says, here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.remote import run as remote_run
from onetrainer.remote.settings import write_secrets_file
from tests.gui.helpers import pump
from tests.helpers import image_folder, tiny_config
from tests.remote.conftest import ssh_server  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.gui, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_start_with_cloud_enabled_trains_on_the_host(app, tmp_path, tmp_path_factory, monkeypatch, ssh_server):  # noqa: F811
    app.runner.train_function = None  # the real one: run_training hands the config to the remote run
    base = tmp_path_factory.getbasetemp()
    secrets = write_secrets_file(ssh_server.secrets(), tmp_path / "secrets" / "secrets.json")
    monkeypatch.setenv("ONETRAINER_SECRETS", str(secrets))
    env = {"XDG_CACHE_HOME": str(base / "xdg-cache"), "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env["ONETRAINER_STATE_DIR"] = str(tmp_path / "host-state")
    monkeypatch.setenv(remote_run.REMOTE_ENV, json.dumps(env))
    image_folder(tmp_path)
    cloud = {
        "enabled": True,
        "type": "LINUX",
        "remote_dir": str(tmp_path / "host"),
        "huggingface_cache_dir": str(tmp_path / "host" / "hf"),
        "onetrainer_dir": str(ROOT),
        "install_cmd": "",
        "update_onetrainer": False,
        "run_id": "gui1",
    }
    path = tmp_path / "remote.json"
    path.write_text(json.dumps(tiny_config(tmp_path, epochs=2, cloud=cloud)), encoding="utf-8")
    assert app.load_config_file(path)
    assert app.model.config.cloud["enabled"] is True
    app.footer.start_button.invoke()
    assert app.footer.start_button.cget("text") == "Stop training"
    pump(app, lambda: not app.footer.running, timeout=600)
    footer = app.footer
    assert footer.status.startswith("Finished (completed)"), footer.status
    assert footer.step_bar.get() == 1 and footer.epoch_text.cget("text") == "2 / 2"
    assert footer.loss_label.cget("text").startswith("loss ")
    assert f"connected to {ssh_server.user}@[127.0.0.1]:{ssh_server.port}" in app.log.text
    output = tmp_path / "out" / "lora.safetensors"
    assert output.is_file() and str(output) in footer.status
    assert (tmp_path / "host" / "runs" / "gui1" / "collected").exists()
