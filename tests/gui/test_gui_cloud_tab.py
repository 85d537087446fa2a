"""The cloud tab: the config's `cloud` block edited as any setting (saved with the config), the connection's secrets
written to the secrets file only (mode 0600, the password masked and never in a saved config)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gui.tabs.cloud import CloudTab
from onetrainer.config.io import load_config
from onetrainer.remote.settings import CloudSettings, load_cloud_secrets, write_secrets_file
from tests.gui.helpers import choose_in_menu

pytestmark = pytest.mark.gui
PASSWORD = "pa55-w0rd-never-shown"


@pytest.fixture
def secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A secrets file of this test's, holding a Hugging Face token the tab must keep."""
    path = write_secrets_file({"huggingface_token": "hf_token_kept"}, tmp_path / "secrets" / "secrets.json")
    monkeypatch.setenv("ONETRAINER_SECRETS", str(path))
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _fill(tab: CloudTab) -> None:
    inputs = tab.inputs
    inputs["enabled"].widget.toggle()
    choose_in_menu(inputs["type"].widget, "LINUX")
    inputs["host"].set_text("203.0.113.7")
    inputs["port"].set_text("2222")
    inputs["user"].set_text("trainer")
    inputs["key_file"].set_text("~/.ssh/id_ed25519")
    inputs["password"].set_text(PASSWORD)
    inputs["remote_dir"].set_text("/data/runs")
    inputs["onetrainer_dir"].set_text("/data/trainer")
    inputs["run_id"].set_text("cats-lora")
    inputs["install_cmd"].set_text("")
    inputs["update_onetrainer"].widget.toggle()
    inputs["download_backups"].widget.toggle()
    choose_in_menu(inputs["on_finish"].widget, "STOP")
    choose_in_menu(inputs["on_error"].widget, "DELETE")
    assert inputs["sub_type"].get() == "" and inputs["sub_type"].widget.get() == "ANY"
    choose_in_menu(inputs["sub_type"].widget, "COMMUNITY")


def test_the_cloud_tab_edits_the_config_and_the_secrets_file(app, secrets_file, tmp_path, screenshot) -> None:
    assert "cloud" in app.tabview.keys
    tab = app.select_tab("cloud")
    assert isinstance(tab, CloudTab)
    assert str(secrets_file) in tab.secrets_note.cget("text")
    assert tab.inputs["password"].widget.cget("show") == "•"  # masked
    assert tab.inputs["api_key"].widget.cget("show") == "•"
    _fill(tab)

    cloud = app.model.config.cloud
    settings = CloudSettings.from_dict(cloud)
    assert settings.enabled and settings.type == "LINUX"
    assert (settings.remote_dir, settings.onetrainer_dir, settings.run_id) == (
        "/data/runs",
        "/data/trainer",
        "cats-lora",
    )
    assert settings.install_cmd == "" and settings.own_install
    assert settings.update_onetrainer is False and settings.download_backups is True
    assert (settings.on_finish, settings.on_error) == ("STOP", "DELETE")
    assert settings.sub_type == "COMMUNITY"
    for secret in ("host", "port", "user", "key_file", "password", "api_key", "id"):
        assert secret not in cloud  # the secrets go to the secrets file only
    assert app.model.unsaved

    # The secrets file: the user's alone, holding the connection and what it held before.
    assert _mode(secrets_file) == 0o600
    data = json.loads(secrets_file.read_text(encoding="utf-8"))
    assert data["huggingface_token"] == "hf_token_kept"
    assert data["cloud"] == {
        "host": "203.0.113.7",
        "port": 2222,
        "user": "trainer",
        "key_file": "~/.ssh/id_ed25519",
        "password": PASSWORD,
    }
    assert load_cloud_secrets(None, secrets_file).port == 2222  # the core reads what the tab wrote
    assert not list(secrets_file.parent.glob(".*tmp"))  # written through a temporary file, replaced at once

    # Save config: the cloud block, and no secret.
    saved = app.save_config_file(tmp_path / "saved.json")
    assert saved is not None
    text = saved.read_text(encoding="utf-8")
    assert PASSWORD not in text and "203.0.113.7" not in text and "id_ed25519" not in text
    assert json.loads(text)["cloud"]["run_id"] == "cats-lora"
    assert PASSWORD not in app.log.text and PASSWORD not in app.footer.status

    # Loaded again: the config's values and the secrets file's shown (the password still masked).
    app.model.replace(load_config(saved)[0])
    tab = app.select_tab("cloud")
    assert tab.inputs["run_id"].get() == "cats-lora" and tab.inputs["enabled"].get() is True
    assert tab.inputs["on_finish"].get() == "STOP" and tab.inputs["download_backups"].get() is True
    assert tab.inputs["host"].get() == "203.0.113.7" and tab.inputs["port"].get() == "2222"
    assert tab.inputs["password"].get() == PASSWORD and tab.inputs["password"].widget.cget("show") == "•"
    app.update()
    path = screenshot(app, "tab-cloud-filled")
    assert path is None or path.stat().st_size > 10_000


def test_bad_cloud_inputs_are_refused_by_name(app, secrets_file) -> None:
    tab = app.select_tab("cloud")
    tab.inputs["port"].set_text("22x")
    assert "secrets: cloud.port" in (tab.inputs["port"].error or "")
    assert any(p.path == "cloud.port" for p in app.input_problems())
    assert "cloud" not in json.loads(secrets_file.read_text(encoding="utf-8"))  # nothing written
    tab.inputs["port"].set_text("70000")
    assert "out of range" in tab.inputs["port"].error
    tab.inputs["port"].set_text("22")
    assert tab.inputs["port"].error is None and not app.input_problems()

    tab.inputs["remote_dir"].set_text("relative/dir")
    assert "cloud.remote_dir" in tab.inputs["remote_dir"].error and "absolute" in tab.inputs["remote_dir"].error
    assert app.model.config.cloud is None  # the config keeps its last valid value (none)
    assert app.save_config_file(app.model.config.workspace_dir + "/never.json") is None  # refused while invalid
    tab.inputs["run_id"].set_text("a/b")
    assert "cloud.run_id" in tab.inputs["run_id"].error
    tab.inputs["volume_size"].set_text("lots")
    assert "cloud.volume_size" in tab.inputs["volume_size"].error
    tab.refresh()  # the config's values shown again: no input error left
    assert not app.input_problems()


def test_a_secrets_file_others_can_read_is_shown_and_never_overwritten(app, secrets_file) -> None:
    os.chmod(secrets_file, 0o644)
    tab = app.select_tab("cloud")
    tab.load_secrets()
    assert "chmod 600" in tab.secrets_note.cget("text")
    before = secrets_file.read_bytes()
    tab.inputs["host"].set_text("198.51.100.1")
    assert secrets_file.read_bytes() == before and _mode(secrets_file) == 0o644
    os.chmod(secrets_file, 0o600)
    tab.inputs["host"].set_text("198.51.100.2")
    assert json.loads(secrets_file.read_text(encoding="utf-8"))["cloud"]["host"] == "198.51.100.2"
    assert "chmod" not in tab.secrets_note.cget("text")


def test_a_new_secrets_file_is_created_with_mode_0600(app, tmp_path, monkeypatch) -> None:
    path = tmp_path / "fresh" / "secrets.json"
    monkeypatch.setenv("ONETRAINER_SECRETS", str(path))
    tab = app.select_tab("cloud")
    tab.load_secrets()
    tab.inputs["api_key"].set_text("rp_key")
    assert _mode(path) == 0o600
    assert json.loads(path.read_text(encoding="utf-8")) == {"cloud": {"api_key": "rp_key"}}
    tab.inputs["user"].set_text("")  # emptied: the default (root) applies again
    tab.inputs["port"].set_text("")
    assert json.loads(path.read_text(encoding="utf-8")) == {"cloud": {"api_key": "rp_key"}}
    assert load_cloud_secrets(None, path).user == "root"


def test_reattach_hands_the_trainer_an_attach_only_copy(app, secrets_file, trainable, pump_until, fake_trainer) -> None:
    app.model.replace(trainable)
    tab = app.select_tab("cloud")
    assert tab.reattach() is False and not app.running  # cloud training is off: nothing starts
    assert "Train remotely" in app.footer.status
    tab.inputs["enabled"].widget.toggle()
    tab.inputs["run_id"].set_text("earlier-run")
    tab.reattach_button.invoke()
    assert app.running, app.footer.status
    pump_until(app, lambda: not app.footer.running)
    handed = app.runner.train_function.config
    assert handed.cloud == {"enabled": True, "run_id": "earlier-run", "attach_only": True}
    app.runner.train_function = fake_trainer(hold=True)
    assert app.start()
    assert tab.reattach() is False and "stop it first" in app.footer.status and app.running  # never stops the run
    app.runner.train_function.release.set()
    pump_until(app, lambda: not app.footer.running)
    assert CloudSettings.from_dict(handed.cloud).attach_only
    assert "attach_only" not in app.model.config.cloud  # the config itself: never saved with it


def test_start_hands_the_cloud_block_as_it_is(app, secrets_file, trainable, pump_until) -> None:
    trainable.cloud = {"enabled": True, "run_id": "r"}
    app.model.replace(trainable)
    assert app.start()
    pump_until(app, lambda: not app.footer.running)
    assert app.runner.train_function.config.cloud == {"enabled": True, "run_id": "r"}
