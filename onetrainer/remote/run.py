"""A training run on another machine over SSH: `run_training` hands a config with `cloud.enabled` here.

What happens, in order (each step a Status event: the footer, the terminal and the log show it):

1. the host: `cloud.type` LINUX is a machine the secrets file names; RUNPOD finds or creates a pod through RunPod's
   API first (`providers.py`), both behind `Provider`;
2. the trainer on the host, in `cloud.onetrainer_dir`: with `cloud.install_cmd` empty or OneTrainer's own clone
   command, this checkout's files are sent (only those whose content differs) and its `install.sh` runs when the
   host has no `.venv` yet or `pyproject.toml` changed; another command runs when the trainer is missing;
3. the config, its paths made the host's (`<remote_dir>/runs/<run_id>/…`), without any secret, and the concepts'
   files (`<remote_dir>/data/…`) and a local base model (`<remote_dir>/models/…`), each file sent only when the host
   lacks its content (SHA-256 computed on both sides);
4. `python -m onetrainer.remote.agent` started detached (`setsid nohup`): it survives the connection;
5. its events read back as they are written and handed to the sinks (the footer, the terminal); Stop / Sample now /
   Save now / Backup now from the caller's `TrainingControl` become command files the agent takes; a dropped
   connection is retried for `RECONNECT_SECONDS` while the run goes on;
6. at the end the outputs download as `cloud.download_*` say, the run is marked collected, and `cloud.on_finish` /
   `on_error` act on the host (RUNPOD: stop or delete the pod).

Reattach: a run directory on the host for `cloud.run_id` that is not marked collected is followed instead of starting
a new run, from its first event (the app or the connection restarted; a finished run is downloaded then). With
`cloud.attach_only` (the cloud tab's Reattach now) a host without that run refuses the start instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shlex
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.remote.connection import RemoteError, SshHost
from onetrainer.remote.settings import CloudError, CloudSecrets, CloudSettings, load_cloud_secrets
from onetrainer.training.events import (
    Broadcast,
    EventSink,
    Failed,
    Finished,
    SampleReady,
    Started,
    Status,
    Warning_,
    event_from_json,
)

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.remote.providers import Provider
    from onetrainer.training.control import TrainingControl

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.5
ALIVE_CHECK_SECONDS = 5.0
FOLLOWER_TOUCH_SECONDS = 15.0  # well within the agent's FOLLOWER_SECONDS
RECONNECT_SECONDS = float(os.environ.get("ONETRAINER_RECONNECT_SECONDS", "600"))
# Environment for the remote trainer (JSON object), e.g. its cache folders; the tests point them into a temp folder.
REMOTE_ENV = "ONETRAINER_REMOTE_ENV"
# This checkout's files a host needs to install and run the trainer (the GUI, the tests and the docs stay here).
TRAINER_FILES = ("onetrainer", "scripts", "presets", "pyproject.toml", "install.sh", "README.md", "LICENSE")
MIB = 1024 * 1024


@dataclass
class Layout:
    """Where a run's files are on the host."""

    settings: CloudSettings

    @property
    def run_dir(self) -> str:
        return posixpath.join(self.settings.remote_dir, "runs", self.settings.run_id)

    @property
    def workspace(self) -> str:
        return posixpath.join(self.run_dir, "workspace")

    @property
    def output_dir(self) -> str:
        return posixpath.join(self.run_dir, "output")

    @property
    def python(self) -> str:
        return posixpath.join(self.settings.onetrainer_dir, ".venv", "bin", "python")

    def file(self, name: str) -> str:
        return posixpath.join(self.run_dir, name)


@dataclass
class Transfer:
    files: int = 0
    bytes: int = 0

    def add(self, counts: tuple[int, int]) -> None:
        self.files += counts[0]
        self.bytes += counts[1]

    def text(self) -> str:
        return f"{self.files} file{'s' if self.files != 1 else ''}, {self.bytes / MIB:.1f} MiB"


@dataclass
class RemoteConfig:
    """The config as the host runs it, the files to send, and what the host's paths are here."""

    data: dict
    uploads: dict[str, Path] = field(default_factory=dict)
    remote_output: str = ""


def run_remote(config: TrainConfig, control: TrainingControl, sinks: list[EventSink]) -> Finished | Failed:
    """Train `config` on its cloud host to the end, or until the connection is lost for good. Never raises."""
    events = Broadcast(sinks)
    outcome = _run(config, control, events)
    events.emit(outcome)
    events.close()
    return outcome


def _run(config: TrainConfig, control: TrainingControl, events: Broadcast) -> Finished | Failed:
    from onetrainer.remote.providers import provider_for

    try:
        settings = CloudSettings.from_dict(config.cloud)
        secrets = load_cloud_secrets(config.secrets)
        provider = provider_for(settings, secrets)
    except CloudError as e:
        return Failed(str(e), refused=True)
    try:
        host_secrets = provider.prepare(events)
        run = RemoteRun(config, settings, host_secrets, control, events, provider)
        return run.run()
    except (CloudError, RemoteError) as e:
        return Failed(str(e))
    except Exception as e:
        return Failed(f"the remote run failed here: {type(e).__name__}: {e}", traceback.format_exc())


class RemoteRun:
    def __init__(
        self,
        config: TrainConfig,
        settings: CloudSettings,
        secrets: CloudSecrets,
        control: TrainingControl,
        events: Broadcast,
        provider: Provider,
    ) -> None:
        self.config = config
        self.settings = settings
        self.secrets = secrets
        self.control = control
        self.events = events
        self.provider = provider
        self.layout = Layout(settings)
        self.host: SshHost | None = None
        self.pending: list[str] = []  # commands taken from the control, not yet on the host
        self.stop_sent = False
        self.command_count = 0
        self.local_workspace = Path(config.workspace_dir)
        self.local_output = Path(config.output_model_destination)
        self.tensorboard = None
        self.followed = float("-inf")  # when the follower file was last touched
        self.reattached = False  # following a run started earlier: its events come again from the first

    # -- the whole run ----------------------------------------------------------------------------------------------
    def run(self) -> Finished | Failed:
        self.host = SshHost(self.secrets)
        self.events.emit(Status(f"connected to {self.host.label}"))
        try:
            attach = self.reattached = self._state() == "running"
            if not attach and self.settings.attach_only:
                return Failed(
                    f"cloud.attach_only: {self.host.label} has no run {self.settings.run_id!r} to reattach to (none "
                    f"was started under that id in {self.layout.run_dir}, or it was downloaded already); Start "
                    "without Reattach starts one",
                    refused=True,
                )
            if attach:
                self.events.emit(Status(f"reattaching to the run {self.settings.run_id!r} on {self.host.label}"))
            else:
                self._install()
                remote = self._upload()
                if self.control.stop_requested:  # Stop while the trainer or the files were being sent
                    return Finished("stopped before the run started on the host")
                self._start(remote)
                if self.settings.detach_trainer:
                    return Finished(
                        f"detached: the run goes on on {self.host.label}; Start again with cloud.run_id "
                        f"{self.settings.run_id!r} to follow it and download its outputs"
                    )
            outcome = self._follow()
            if outcome is None:
                return Failed(
                    f"the connection to {self.host.label} was lost for {RECONNECT_SECONDS:.0f} s; the run goes on "
                    f"there: Start again with cloud.run_id {self.settings.run_id!r} to reattach"
                )
            outcome = self._collect(outcome)
            self._act(outcome)
            return outcome
        finally:
            if self.tensorboard is not None:
                self.tensorboard.stop()
            if self.host is not None:
                self.host.close()

    def _state(self) -> str:
        """'running' when the host has this run_id's run not yet collected (running or ended), else 'new'."""
        run_dir = shlex.quote(self.layout.run_dir)
        command = f"test -d {run_dir} && test -e {run_dir}/launch.pid && ! test -e {run_dir}/collected && echo running"
        _, out, _ = self.host.run(command)
        return "running" if out.strip() == "running" else "new"

    # -- 2. the trainer on the host ---------------------------------------------------------------------------------
    def _install(self) -> None:
        settings, python = self.settings, self.layout.python
        installed = self.host.run(f"test -x {shlex.quote(python)}")[0] == 0
        directory = shlex.quote(settings.onetrainer_dir)
        if settings.own_install:
            if not installed and not settings.install_onetrainer:
                raise CloudError(
                    f"cloud.install_onetrainer is off and the host has no trainer at {python} (cloud.onetrainer_dir)"
                )
            if not installed or settings.update_onetrainer:
                files = trainer_files(settings.onetrainer_dir)
                self.events.emit(Status(f"checking the trainer's {len(files)} files on the host"))
                before = self.host.hashes(python, [posixpath.join(settings.onetrainer_dir, "pyproject.toml")])
                sent = self.host.upload(files, python)
                project = posixpath.join(settings.onetrainer_dir, "pyproject.toml")
                changed = before.get(project) != _hash(PACKAGE_ROOT / "pyproject.toml")
                self.events.emit(Status(f"trainer files sent: {Transfer(*sent).text()}"))
                if not installed or changed:
                    self.events.emit(
                        Status(f"installing the trainer on the host (cd {settings.onetrainer_dir}; ./install.sh)")
                    )
                    self.host.check(
                        f"cd {directory} && chmod +x install.sh && ./install.sh", "install.sh", timeout=7200
                    )
        elif not installed or settings.update_onetrainer:
            if not installed and not settings.install_onetrainer:
                raise CloudError(f"cloud.install_onetrainer is off and the host has no trainer at {python}")
            where = settings.onetrainer_dir if installed else posixpath.dirname(settings.onetrainer_dir)
            self.events.emit(Status(f"running cloud.install_cmd on the host (in {where})"))
            quoted = shlex.quote(where)
            self.host.check(
                f"mkdir -p {quoted} && cd {quoted} && {settings.install_cmd}", "cloud.install_cmd", timeout=7200
            )
        if self.host.run(f"test -x {shlex.quote(python)}")[0] != 0:
            raise CloudError(
                f"the host has no trainer at {python} after installing (cloud.onetrainer_dir, cloud.install_cmd)"
            )

    # -- 3. the config and the files --------------------------------------------------------------------------------
    def _upload(self) -> RemoteConfig:
        remote = remote_config(self.config, self.settings)
        self.events.emit(Status(f"sending the run's files ({len(remote.uploads)}; only those the host lacks)"))
        sent = Transfer(*self.host.upload(remote.uploads, self.layout.python))
        total = sum(p.stat().st_size for p in remote.uploads.values())
        self.events.emit(
            Status(f"sent {sent.text()} of {len(remote.uploads)} files ({total / MIB:.1f} MiB); the rest were there")
        )
        run_dir = shlex.quote(self.layout.run_dir)
        self.host.check(f"rm -rf {run_dir} && mkdir -p {run_dir}/control", "preparing the run's folder")
        self.host.put_bytes(json.dumps(remote.data, indent=2).encode(), self.layout.file("config.json"))
        return remote

    # -- 4. start ---------------------------------------------------------------------------------------------------
    def _start(self, remote: RemoteConfig) -> None:
        run_dir = shlex.quote(self.layout.run_dir)
        env = remote_environment()
        assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        # Only the trainer goes to the background, its output in run.log: a backgrounded `cd && …` list would keep the
        # session's output open (the command would not return until the run ends).
        # The Hugging Face token (the secrets file's `huggingface_token`, for gated models) reaches the trainer's
        # environment through the session's input: never on a command line, in a file or a log on the host.
        token = huggingface_token()
        read_token = "IFS= read -r HF_TOKEN; export HF_TOKEN; " if token else ""
        command = (
            f"cd {shlex.quote(self.settings.onetrainer_dir)} && {{ {read_token}"
            f"HF_HOME={shlex.quote(self.settings.huggingface_cache_dir)} PYTHONUNBUFFERED=1 {assignments} "
            f"setsid nohup {shlex.quote(self.layout.python)} -m onetrainer.remote.agent {run_dir} "
            f"> {run_dir}/run.log 2>&1 < /dev/null & echo $! > {run_dir}/launch.pid; }}"
        )
        if self.settings.detach_trainer:
            actions = {
                key: self.provider.detached_command(action, self.events, name)
                for key, action, name in (
                    ("finished", self.settings.on_detached_finish, "cloud.on_detached_finish"),
                    ("failed", self.settings.on_detached_error, "cloud.on_detached_error"),
                )
            }
            self.host.put_bytes(json.dumps(actions).encode(), self.layout.file("on_end.json"))
        self.host.check(command, "starting the trainer", stdin=(token + "\n").encode() if token else b"")
        self.events.emit(
            Status(f"the run {self.settings.run_id!r} started on {self.host.label} ({self.layout.run_dir})")
        )

    # -- 5. follow --------------------------------------------------------------------------------------------------
    def _follow(self) -> Finished | Failed | None:
        offset, rest = 0, b""
        last_check = time.monotonic()
        while True:
            try:
                self._send_commands()
                chunk = self.host.read_from(self.layout.file("events.jsonl"), offset)
                if chunk:
                    offset += len(chunk)
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop()
                    for line in lines:
                        outcome = self._handle(line)
                        if outcome is not None:
                            return outcome
                elif time.monotonic() - last_check > ALIVE_CHECK_SECONDS:
                    last_check = time.monotonic()
                    if not self._alive():
                        chunk = self.host.read_from(self.layout.file("events.jsonl"), offset) or b""
                        if not chunk:
                            return Failed(
                                f"the trainer on {self.host.label} ended without an outcome; its output:\n"
                                + self._log_tail()
                            )
                        continue
                time.sleep(POLL_SECONDS)
            except RemoteError as e:
                if not self._reconnect(e):
                    return None

    def _handle(self, line: bytes) -> Finished | Failed | None:
        if not line.strip():
            return None
        try:
            event = event_from_json(line.decode("utf-8", "replace"))
        except ValueError:
            return None
        if event is None:
            return None
        if isinstance(event, Finished | Failed):
            return event
        if isinstance(event, Started):
            event = Started(
                event.run_name,
                event.total_steps,
                event.total_epochs,
                event.steps_per_epoch,
                "",
                str(self.local_workspace),
            )
            self._start_tensorboard(event.run_name)
        elif isinstance(event, SampleReady) and self.settings.download_samples:
            local = self.local_path(event.path)
            if local is not None:
                with contextlib.suppress(RemoteError):
                    self.host.download(event.path, local)
                    event = SampleReady(event.global_step, event.index, event.prompt, str(local))
        self.events.emit(event)
        return None

    def _start_tensorboard(self, run_name: str) -> None:
        """The streamed losses, learning rates and samples written into a TensorBoard folder here, as a local run
        writes them (`workspace_dir/tensorboard/<run>`), and with `tensorboard` on its server started here: the app's
        TensorBoard button shows the remote run live, without a tunnel. A reattached run's events come again from its
        first step: the steps already in its folder (written when it was followed before) are not written twice."""
        if self.tensorboard is not None:
            return
        from onetrainer.training.tensorboard import RunTensorBoard
        from onetrainer.training.workspace import SUBDIRS, Workspace

        for sub in SUBDIRS:
            (self.local_workspace / sub).mkdir(parents=True, exist_ok=True)
        workspace = Workspace(self.local_workspace, run_name)
        self.tensorboard = RunTensorBoard(self.config, workspace, self.events, True, continues=self.reattached)
        self.tensorboard.start()

    def _send_commands(self) -> None:
        now = time.monotonic()
        if now - self.followed > FOLLOWER_TOUCH_SECONDS:  # the agent leaves the end action to us while we follow
            self.host.run(f"touch {shlex.quote(self.layout.file('follower'))}")
            self.followed = now
        if self.control.stop_requested and not self.stop_sent:
            self.pending.append("stop")
            self.stop_sent = True
        for command in ("sample", "save", "backup"):
            if self.control.take(command):
                self.pending.append(command)
        while self.pending:
            command = self.pending[0]
            self.command_count += 1
            name = f"{time.time_ns()}-{self.command_count}-{command}"
            self.host.put_bytes(b"", posixpath.join(self.layout.run_dir, "control", name))
            self.pending.pop(0)

    def _alive(self) -> bool:
        pid_file = shlex.quote(self.layout.file("launch.pid"))
        command = (
            f'p=$(cat {pid_file} 2>/dev/null); [ -n "$p" ] && [ -e /proc/$p ] && '
            f"! grep -q '^[0-9]* (.*) Z' /proc/$p/stat && echo alive"
        )
        return self.host.run(command)[1].strip() == "alive"

    def _log_tail(self) -> str:
        return self.host.run(f"tail -n 20 {shlex.quote(self.layout.file('run.log'))}")[1].strip() or "(none)"

    def _reconnect(self, error: RemoteError) -> bool:
        self.events.emit(Warning_(f"{error}; reconnecting (the run goes on on the host)"))
        deadline = time.monotonic() + RECONNECT_SECONDS
        delay = 1.0
        while time.monotonic() < deadline:
            self.host.close()
            try:
                self.host = SshHost(self.secrets)
            except (RemoteError, CloudError) as e:
                if "refused the login" in str(e) or "host key" in str(e):
                    raise
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 30.0)
                continue
            self.events.emit(Status(f"reconnected to {self.host.label}"))
            return True
        return False

    # -- 6. the end -------------------------------------------------------------------------------------------------
    def local_path(self, remote: str) -> Path | None:
        """Where a file of the host's run lands here: its workspace's in the local workspace, its output at the
        local output destination."""
        for prefix, local in (
            (self.layout.workspace, self.local_workspace),
            (posixpath.join(self.layout.output_dir, self.local_output.name), self.local_output),
        ):
            if remote == prefix or remote.startswith(prefix + "/"):
                relative = posixpath.relpath(remote, prefix)
                return local if relative == "." else local / Path(*relative.split("/"))
        return None

    def _collect(self, outcome: Finished | Failed) -> Finished | Failed:
        settings, got = self.settings, Transfer()
        folders = ["logs", "config"]
        folders += [
            name
            for name, wanted in (
                ("samples", settings.download_samples),
                ("save", settings.download_saves),
                ("backup", settings.download_backups),
                ("tensorboard", settings.download_tensorboard),
            )
            if wanted
        ]
        for name in folders:
            # The host's TensorBoard files beside the ones written here from the streamed events (not into the same
            # folder: TensorBoard would show each value twice).
            local = self.local_workspace / ("tensorboard-host" if name == "tensorboard" else name)
            got.add(self.host.download(posixpath.join(self.layout.workspace, name), local))
        got.add(
            self.host.download(
                self.layout.file("run.log"), self.local_workspace / "logs" / f"remote-{settings.run_id}.log"
            )
        )
        if isinstance(outcome, Finished) and outcome.output_path and settings.download_output_model:
            local = self.local_path(outcome.output_path)
            if local is not None:
                got.add(self.host.download(outcome.output_path, local))
                outcome = Finished(outcome.reason, str(local), outcome.global_step)
        if isinstance(outcome, Failed) and outcome.log_path:
            local = self.local_path(outcome.log_path)
            outcome = Failed(outcome.message, outcome.traceback, str(local or ""), outcome.refused)
        self.events.emit(Status(f"downloaded {got.text()} into {self.local_workspace}"))
        run_dir = shlex.quote(self.layout.run_dir)
        self.host.run(f"touch {run_dir}/collected")
        if settings.delete_workspace:
            self.host.run(f"rm -rf {run_dir}")
            self.events.emit(Status(f"deleted the run's folder on the host ({self.layout.run_dir})"))
        return outcome

    def _act(self, outcome: Finished | Failed) -> None:
        action = self.settings.on_finish if isinstance(outcome, Finished) else self.settings.on_error
        name = "cloud.on_finish" if isinstance(outcome, Finished) else "cloud.on_error"
        if action != "NONE":
            try:
                self.provider.act(action, self.events, name)
            except (CloudError, RemoteError) as e:
                self.events.emit(Warning_(f"{name} {action}: {e}"))


def huggingface_token() -> str:
    from onetrainer.remote.settings import read_secrets_file

    token = read_secrets_file().get("huggingface_token") or ""
    return token.strip() if isinstance(token, str) else ""


def remote_environment() -> dict[str, str]:
    text = os.environ.get(REMOTE_ENV, "")
    if not text:
        return {}
    data = json.loads(text)
    return {str(k): str(v) for k, v in data.items()}


def trainer_files(onetrainer_dir: str) -> dict[str, Path]:
    """This checkout's files the host needs, by their path on the host."""
    files: dict[str, Path] = {}
    for name in TRAINER_FILES:
        path = PACKAGE_ROOT / name
        if path.is_file():
            files[posixpath.join(onetrainer_dir, name)] = path
        elif path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                    relative = file.relative_to(PACKAGE_ROOT).as_posix()
                    files[posixpath.join(onetrainer_dir, relative)] = file
    return files


def _hash(path: Path) -> str:
    from onetrainer.remote.connection import file_hash

    return file_hash(path)


def _place(local: Path, folder: str, uploads: dict[str, Path]) -> str:
    """A local file or folder's place under `folder` on the host (named by its local path, so each keeps one place and
    a second run sends only what changed); its files join `uploads`."""
    local = local.absolute()
    tag = hashlib.sha256(str(local).encode()).hexdigest()[:10]
    target = posixpath.join(folder, f"{local.name}-{tag}")
    if local.is_file():
        uploads[target] = local
    else:
        for file in sorted(local.rglob("*")):
            if file.is_file():
                uploads[posixpath.join(target, file.relative_to(local).as_posix())] = file
    return target


# Paths the run rewrites itself (its own folders on the host) or never reads there (the side files are inlined).
_NOT_SENT = {"workspace_dir", "cache_dir", "output_model_destination", "huggingface_cache_dir", "debug_dir"}
_NOT_SENT |= {"concept_file_name", "sample_definition_file_name"}


def _send_local_paths(data, key: str, uploads: dict[str, Path], data_dir: str, models_dir: str) -> None:
    """Every setting naming a local file or folder (a concept's images and prompts, a base model or part, a LoRA or
    embedding to continue from, a sample's base image…) sent to the host and renamed to its place there: concept
    folders under `data/`, the rest under `models/`."""
    if isinstance(data, dict):
        for name, value in data.items():
            if name == "cloud":
                continue
            if isinstance(value, str):
                wanted = name in ("path", "prompt_path") or name.endswith(("_name", "_path"))
                if wanted and name not in _NOT_SENT and value and Path(value).exists():
                    folder = data_dir if name in ("path", "prompt_path") else models_dir
                    data[name] = _place(Path(value), folder, uploads)
            else:
                _send_local_paths(value, name, uploads, data_dir, models_dir)
    elif isinstance(data, list):
        for item in data:
            _send_local_paths(item, key, uploads, data_dir, models_dir)


def remote_config(config: TrainConfig, settings: CloudSettings) -> RemoteConfig:
    """The packed config with the host's paths, the cloud block off and no secrets; and the files to send."""
    from onetrainer.config.io import pack

    layout = Layout(settings)
    packed, _ = pack(config)
    data = packed.to_dict()
    data.pop("secrets", None)
    data["cloud"] = {**(data.get("cloud") or {}), "enabled": False}
    uploads: dict[str, Path] = {}
    data_dir = posixpath.join(settings.remote_dir, "data")
    models_dir = posixpath.join(settings.remote_dir, "models")
    _send_local_paths(data, "", uploads, data_dir, models_dir)
    data["tensorboard"] = False  # no server on the host: the streamed events feed one here (RemoteRun)
    data["workspace_dir"] = layout.workspace
    data["cache_dir"] = posixpath.join(layout.run_dir, "cache")
    output = posixpath.join(layout.output_dir, Path(config.output_model_destination).name or "model")
    data["output_model_destination"] = output
    if "huggingface_cache_dir" in data:
        data["huggingface_cache_dir"] = settings.huggingface_cache_dir
    return RemoteConfig(data, uploads, output)
