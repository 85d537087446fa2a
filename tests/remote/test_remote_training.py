"""Training over SSH (`onetrainer/remote/`) against a real OpenSSH server on 127.0.0.1 (conftest.py): the "host" is this
machine, its trainer this checkout (`cloud.onetrainer_dir`: its files are compared by content, none sent), its
workspace another temp folder.

One tiny run serves most checks: it starts detached (the app's side returns at once), is reattached by its
`cloud.run_id` as after a restart of the app, has its connection cut mid-run (and reconnects), gets Sample now, Save
now and Stop through the caller's control, and downloads its outputs; then every file written here and on the host
is searched for the secret."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.remote import run as remote_run
from onetrainer.remote.connection import AuthenticationFailed, HostKeyChanged, SshHost, known_hosts_path
from onetrainer.remote.settings import CloudError, load_cloud_secrets, secrets_path, write_secrets_file
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, ListSink, Progress, SampleReady, Status, Warning_
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, read_scalars, tiny_config
from tests.remote.conftest import PASSPHRASE

ROOT = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_TestToken0123456789abcdef"  # a second secret: it reaches the trainer's environment on the host only
pytestmark = pytest.mark.slow


def _cloud(remote: Path, **changes) -> dict:
    return {
        "enabled": True,
        "type": "LINUX",
        "remote_dir": str(remote),
        "huggingface_cache_dir": str(remote / "hf"),
        "onetrainer_dir": str(ROOT),  # this checkout is the host's trainer: install.sh never runs (its .venv exists)
        "install_cmd": "",
        "run_id": "tiny1",
        "download_saves": True,
        **changes,
    }


@pytest.fixture(scope="module")
def secrets_env(ssh_server, tmp_path_factory):
    """The secrets file (0600) and the host's environment for the trainer (the tests' caches, offline)."""
    base = tmp_path_factory.getbasetemp()
    env = {
        "XDG_CACHE_HOME": str(base / "xdg-cache"),  # the tiny models the tests built already
        "ONETRAINER_STATE_DIR": str(base / "remote-state"),
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
    }
    path = write_secrets_file(
        {**ssh_server.secrets(), "huggingface_token": HF_TOKEN}, base / "secrets" / "secrets.json"
    )
    return {"ONETRAINER_SECRETS": str(path), remote_run.REMOTE_ENV: json.dumps(env)}


@pytest.fixture
def secrets(secrets_env, monkeypatch):
    for name, value in secrets_env.items():
        monkeypatch.setenv(name, value)
    return Path(secrets_env["ONETRAINER_SECRETS"])


@pytest.fixture(scope="module")
def trained(ssh_server, secrets_env, tmp_path_factory):
    """The one remote run: detached start, reattach, a cut connection, sample / save / stop, downloads."""
    root = tmp_path_factory.mktemp("remote-run")
    remote = tmp_path_factory.mktemp("remote-host")
    image_folder(root)
    samples = [{"prompt": "a red square", "width": 64, "height": 64, "diffusion_steps": 2, "seed": 1}]
    data = tiny_config(root, epochs=20, samples=samples, cloud=_cloud(remote, detach_trainer=True))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in secrets_env.items():
            mp.setenv(name, value)
        hosts: list[SshHost] = []

        class Recorded(SshHost):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                hosts.append(self)

        mp.setattr(remote_run, "SshHost", Recorded)
        mp.setattr(remote_run, "RECONNECT_SECONDS", 60.0)
        config, problems = config_from_dict(data)
        assert not [p for p in problems if p.is_error], problems
        detached = ListSink()
        first = run_training(config, TrainingControl(), [detached])
        assert isinstance(first, Finished) and first.reason.startswith("detached"), first

        # The app restarted: the same run_id follows the run on the host instead of starting another.
        config.cloud = {**config.cloud, "detach_trainer": False}
        control = TrainingControl()
        seen: dict[str, bool] = {}

        class Driver(ListSink):
            def emit(self, event):
                super().emit(event)
                if isinstance(event, Progress) and not seen.get("cut"):
                    seen["cut"] = True
                    pid = (remote / "runs" / "tiny1" / "launch.pid").read_text().strip()
                    seen["environ"] = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    hosts[-1].client.close()  # the connection drops mid-run
                    control.request_sample()
                    control.request_save()
                elif isinstance(event, SampleReady) and not seen.get("stop"):
                    seen["stop"] = True
                    control.request_stop()

        sink = Driver()
        outcome = run_training(config, control, [sink])
    return {
        "root": root,
        "remote": remote,
        "config": config,
        "detached": detached,
        "sink": sink,
        "outcome": outcome,
        "environ": seen.get("environ"),
    }


def test_a_detached_run_is_reattached_and_survives_a_cut_connection(trained):
    detached, sink, outcome = trained["detached"], trained["sink"], trained["outcome"]
    texts = [e.text for e in detached.of(Status)]
    assert any("trainer files sent: 0 files" in t for t in texts), texts  # the checkout's files are on the host
    assert any(t.startswith("sent ") for t in texts), texts
    assert not detached.of(Progress)  # the app's side returned at once
    said = [e for e in sink.events if isinstance(e, Status | Warning_ | SampleReady)]
    assert isinstance(outcome, Finished), "\n".join(map(str, [outcome, *said]))
    statuses = [e.text for e in sink.of(Status)]
    assert any("reattaching to the run 'tiny1'" in t for t in statuses), statuses
    assert any("reconnecting" in w.text for w in sink.of(Warning_)), [w.text for w in sink.of(Warning_)]
    assert any(t.startswith("reconnected") for t in statuses), statuses
    progress = sink.of(Progress)
    assert progress and progress[-1].global_step < progress[-1].total_steps  # the Stop ended it early
    assert outcome.reason == "stopped"


def test_the_commands_act_on_the_remote_run_and_the_outputs_download(trained):
    root, sink, outcome = trained["root"], trained["sink"], trained["outcome"]
    samples = sink.of(SampleReady)
    assert samples and Path(samples[0].path).is_file()  # downloaded as it was made
    assert Path(samples[0].path).is_relative_to(root / "workspace" / "samples")
    output = root / "out" / "lora.safetensors"
    assert outcome.output_path == str(output) and output.is_file()
    from safetensors.torch import load_file

    assert load_file(output)  # a LoRA file with tensors
    saves = list((root / "workspace" / "save").rglob("*.safetensors"))
    assert saves, "Save now wrote nothing that was downloaded"
    assert list((root / "workspace" / "logs").glob("remote-tiny1.log"))
    # The streamed losses in a TensorBoard folder here (the host's own files were not downloaded).
    scalars = read_scalars(root / "workspace" / "tensorboard")
    steps = [step for step, _ in scalars["loss/train_step"]]
    assert steps == sorted(set(steps)) and steps[-1] == sink.of(Progress)[-1].global_step


def test_the_run_s_files_are_sent_only_when_their_content_changed(trained, secrets):
    from onetrainer.remote.settings import CloudSettings

    settings = CloudSettings.from_dict(trained["config"].cloud)
    remote = remote_run.remote_config(trained["config"], settings)
    assert "secrets" not in remote.data and remote.data["cloud"]["enabled"] is False
    host = SshHost(load_cloud_secrets())
    try:
        python = remote_run.Layout(settings).python
        assert host.upload(remote.uploads, python) == (0, 0)
        changed = sorted(p for p in remote.uploads.values() if p.suffix == ".txt")[0]
        changed.write_text("a blue circle", encoding="utf-8")
        assert host.upload(remote.uploads, python) == (1, changed.stat().st_size)
    finally:
        host.close()


def test_no_written_file_holds_the_secret(trained, ssh_server, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    secrets_file = secrets_path_in(base)
    found = []
    for folder in (trained["root"], trained["remote"], base / "state", base / "remote-state"):
        for path in folder.rglob("*"):
            if path.is_file() and path != secrets_file:
                data = path.read_bytes()
                if PASSPHRASE.encode() in data or HF_TOKEN.encode() in data:
                    found.append(path)
    assert found == []
    assert f"HF_TOKEN={HF_TOKEN}".encode() in trained["environ"]  # where the token is meant to be
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert PASSPHRASE.encode() in secrets_file.read_bytes()  # the search would have found it


def secrets_path_in(base: Path) -> Path:
    return base / "secrets" / "secrets.json"


def test_a_changed_host_key_is_refused_naming_the_host(ssh_server, secrets, tmp_path):
    host = SshHost(load_cloud_secrets())  # trusted on first use, recorded in the app's known_hosts
    host.close()
    label = f"[127.0.0.1]:{ssh_server.port}"
    recorded = known_hosts_path().read_text()
    assert label in recorded
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key_type, key = (other.with_suffix(".pub")).read_text().split()[:2]
    known_hosts_path().write_text(f"{label} {key_type} {key}\n")
    with pytest.raises(HostKeyChanged, match=r"host key of \[127\.0\.0\.1\]:\d+ has changed"):
        SshHost(load_cloud_secrets())
    known_hosts_path().write_text(recorded)


def test_a_wrong_password_is_refused_without_echoing_it(ssh_server, tmp_path, monkeypatch):
    wrong = "not-the-Password-41"
    path = write_secrets_file(ssh_server.secrets(key_file="", password=wrong), tmp_path / "secrets.json")
    monkeypatch.setenv("ONETRAINER_SECRETS", str(path))
    with pytest.raises(AuthenticationFailed) as refused:
        SshHost(load_cloud_secrets())
    assert "refused the login with the password" in str(refused.value) and wrong not in str(refused.value)
    assert wrong not in repr(load_cloud_secrets())


def test_the_cli_trains_remotely_and_reports_a_refused_login(ssh_server, tmp_path):
    """scripts/train.py takes the cloud block as the app does; a refused login ends it with exit code 1."""
    wrong = "not-the-Password-77"
    path = write_secrets_file(ssh_server.secrets(key_file="", password=wrong), tmp_path / "secrets.json")
    image_folder(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_config(tmp_path, cloud=_cloud(tmp_path / "host"))), encoding="utf-8")
    env = {**os.environ, "ONETRAINER_SECRETS": str(path)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config-path", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "refused the login with the password" in result.stdout + result.stderr
    assert wrong not in result.stdout + result.stderr


def test_the_secrets_file_is_the_user_s_alone(tmp_path):
    path = write_secrets_file({"cloud": {"host": "h", "password": "pw"}}, tmp_path / "s.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(CloudError, match=r"can be read by other users \(mode 0644\): run `chmod 600"):
        load_cloud_secrets(path=path)
    assert secrets_path().name == "secrets.json"


def test_a_wrong_cloud_setting_is_named(tmp_path):
    image_folder(tmp_path)
    config, _ = config_from_dict(tiny_config(tmp_path, cloud={"enabled": True, "type": "LINUX", "run_id": "a/b"}))
    outcome = run_training(config, TrainingControl(), [])
    assert isinstance(outcome, Failed) and outcome.refused and "cloud.run_id" in outcome.message


def test_every_local_file_the_config_names_is_sent_and_renamed(tmp_path):
    """The concept's images and the LoRA to continue from are sent; a hub name and the run's own folders are not."""
    from onetrainer.remote.settings import CloudSettings

    image_folder(tmp_path)
    lora = tmp_path / "start.safetensors"
    lora.write_bytes(b"weights")
    data = tiny_config(tmp_path, lora_model_name=str(lora), cloud=_cloud(Path("/srv/ot")))
    config, _ = config_from_dict(data)
    remote = remote_run.remote_config(config, CloudSettings.from_dict(config.cloud))
    assert remote.data["lora_model_name"].startswith("/srv/ot/models/start.safetensors-")
    assert remote.uploads[remote.data["lora_model_name"]] == lora
    concept = remote.data["concepts"][0]["path"]
    assert concept.startswith("/srv/ot/data/images-")
    assert sorted(p.name for p in remote.uploads.values() if p.parent == tmp_path / "images") == sorted(
        p.name for p in (tmp_path / "images").iterdir()
    )
    assert remote.data["base_model_name"] == "tiny:sd15"
    assert remote.data["workspace_dir"] == "/srv/ot/runs/tiny1/workspace" and remote.data["tensorboard"] is False
    assert remote.data["output_model_destination"] == "/srv/ot/runs/tiny1/output/lora.safetensors"


def test_stop_before_the_start_starts_nothing(ssh_server, secrets, tmp_path):
    """Stop pressed while the files travel: the run never starts on the host."""
    image_folder(tmp_path)
    config, _ = config_from_dict(tiny_config(tmp_path, cloud=_cloud(tmp_path / "host", update_onetrainer=False)))
    control = TrainingControl()
    control.request_stop()
    outcome = run_training(config, control, [])
    assert isinstance(outcome, Finished) and outcome.reason == "stopped before the run started on the host"
    assert not (tmp_path / "host" / "runs" / "tiny1" / "launch.pid").exists()
    assert (tmp_path / "host" / "runs" / "tiny1" / "config.json").is_file()


def test_a_queue_trains_a_remote_run_and_then_a_local_one(secrets, tmp_path):
    """The queue takes a config with its cloud block as a remote entry: it trains on the host (its LoRA downloaded
    here), then the local entry after it trains here; the queued file holds the host's settings, never a secret."""
    from onetrainer.remote.settings import load_cloud_secrets
    from onetrainer.training.job_queue import FINISHED, JobQueue, run_queue

    queue = JobQueue(tmp_path / "state" / "job-queue.json")
    configs = []
    for name, cloud in (("remote", _cloud(tmp_path / "host", run_id="queued1")), ("local", None)):
        root = tmp_path / name
        image_folder(root, count=2)
        config, problems = config_from_dict(tiny_config(root, epochs=1, **({"cloud": cloud} if cloud else {})))
        assert not [p for p in problems if p.is_error], problems
        configs.append(config)
    remote, local = (queue.add(config) for config in configs)
    assert (remote.kind, local.kind) == ("remote", "local")
    assert ", remote," in remote.line(1) and ", remote," not in local.line(2)
    result = run_queue(queue)
    assert [e.status for e in queue.entries()] == [FINISHED, FINISHED], [e.reason for e in queue.entries()]
    assert [outcome.reason for _, outcome in result.done] == ["completed", "completed"]
    for name in ("remote", "local"):
        assert (tmp_path / name / "out" / "lora.safetensors").is_file()
    assert (tmp_path / "host" / "runs" / "queued1").is_dir()  # the remote entry trained on the host
    queued = queue.path.read_text(encoding="utf-8")
    given = load_cloud_secrets()
    assert given.password == PASSPHRASE
    assert not [v for v in (given.password, given.api_key, HF_TOKEN) if v and v in queued]


def test_attach_only_refuses_a_host_without_the_run_and_starts_nothing(ssh_server, secrets, tmp_path):
    """Reattach now (`cloud.attach_only`) with a run id the host has no run of: refused by name, nothing sent."""
    image_folder(tmp_path)
    cloud = _cloud(tmp_path / "host", run_id="never-started", attach_only=True)
    config, _ = config_from_dict(tiny_config(tmp_path, cloud=cloud))
    sink = ListSink()
    outcome = run_training(config, TrainingControl(), [sink])
    assert isinstance(outcome, Failed) and outcome.refused, outcome
    assert "cloud.attach_only" in outcome.message and "'never-started'" in outcome.message
    assert not (tmp_path / "host" / "runs").exists() and not (tmp_path / "host" / "data").exists()
    assert not any("sending" in s.text or "checking the trainer" in s.text for s in sink.of(Status))
