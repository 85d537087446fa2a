"""The cloud tab: train on another machine over SSH (OneTrainer's cloud tab; `onetrainer/remote/`).

Two stores are edited here. The config's `cloud` block (where and how to train remotely) is written into the config as
any setting is, and saved with it. The connection's secrets (host, port, user, key file, password, API key, pod id)
go to the secrets file only (`secrets.json`, mode 0600, written whole and atomically by
`settings.write_secrets_file`), never into the config: Save config cannot write them. The password and the API key
are masked entries; neither is ever put into a message, the log or the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import LABEL_WIDTH
from gui.forms.form import Group
from gui.tabs.form_tab import FormTab, TabHost
from gui.widgets.tooltip import add_tooltip
from onetrainer.remote.settings import (
    ACTIONS,
    TYPES,
    CloudError,
    CloudSecrets,
    CloudSettings,
    read_secrets_file,
    secrets_path,
    write_secrets_file,
)

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

MUTED_TEXT = ("gray40", "gray60")
ERROR_TEXT = ("#b3261e", "#ff8a80")
ERROR_BORDER = "#d9534f"
MASK = "•"
SUB_TYPES = ("", "SECURE", "COMMUNITY")  # RunPod's cloud types ("": either)
CHOICE_LABELS = {"": "ANY"}  # how a choice's value shows in its menu, where it is not the value itself
CONFIG = "config"  # a field of the config's `cloud` block
SECRET = "secret"  # a field of the secrets file's `cloud` object


@dataclass(frozen=True)
class CloudField:
    key: str  # the name in the `cloud` block or in the secrets file's `cloud`
    label: str
    tooltip: str
    store: str = CONFIG
    kind: str = "text"  # text, int, bool, choice, password
    choices: tuple[str, ...] = ()


def _actions(when: str) -> str:
    return (
        f"What happens to the host {when}: NONE leaves it running; STOP stops a RunPod pod; DELETE deletes a RunPod "
        "pod, with what is left on it. A LINUX host is yours: it is always left running."
    )


GROUPS: tuple[tuple[str, tuple[CloudField, ...]], ...] = (
    (
        "Connection",
        (
            CloudField(
                "enabled", "Train remotely", "Start trains on the host below instead of this machine.", kind="bool"
            ),
            CloudField(
                "type",
                "Type",
                "LINUX: any Linux machine you can SSH into (its host and port below). RUNPOD: a RunPod pod, found by "
                "its pod id or created through RunPod's API (the API key and the RunPod group).",
                kind="choice",
                choices=TYPES,
            ),
            CloudField("host", "Host", "The SSH server's name or address (saved in the secrets file).", SECRET),
            CloudField("port", "Port", "The SSH port; empty: 22 (saved in the secrets file).", SECRET, "int"),
            CloudField("user", "User", "The SSH user (saved in the secrets file). RunPod's is root.", SECRET),
            CloudField(
                "key_file",
                "SSH key file",
                "The private key to log in with, e.g. ~/.ssh/id_ed25519; empty: the password logs in (saved in the "
                "secrets file).",
                SECRET,
            ),
            CloudField(
                "password",
                "Password",
                "With a key file, the key's passphrase (empty for none); without one, the login password. Saved in "
                "the secrets file only, never shown.",
                SECRET,
                "password",
            ),
            CloudField(
                "api_key",
                "RunPod API key",
                "RUNPOD only; empty for LINUX (saved in the secrets file).",
                SECRET,
                "password",
            ),
            CloudField(
                "id",
                "RunPod pod id",
                "RUNPOD: the pod to train on; empty: create one (Create pod) (saved in the secrets file).",
                SECRET,
            ),
        ),
    ),
    (
        "Run",
        (
            CloudField("remote_dir", "Remote folder", "The host's folder for the runs, the data and the models."),
            CloudField("onetrainer_dir", "Trainer folder", "Where the trainer is (or is installed) on the host."),
            CloudField(
                "huggingface_cache_dir",
                "Hugging Face cache",
                "The host's folder for the models it downloads from the Hugging Face hub.",
            ),
            CloudField(
                "install_onetrainer",
                "Install the trainer",
                "Install the trainer on the host when it is not there yet.",
                kind="bool",
            ),
            CloudField(
                "install_cmd",
                "Install command",
                "Empty (or OneTrainer's own `git clone`): this checkout's version is sent and its install.sh runs. "
                "Another command runs in the trainer folder's parent and must leave <trainer folder>/.venv.",
            ),
            CloudField(
                "update_onetrainer",
                "Update the trainer",
                "Send this checkout's changed files (or run the install command) again before each run.",
                kind="bool",
            ),
            CloudField(
                "detach_trainer",
                "Detach",
                "Start the run and leave it: it goes on on the host without this app; Reattach follows it later.",
                kind="bool",
            ),
            CloudField(
                "run_id",
                "Run id",
                "The run's name on the host (<remote folder>/runs/<run id>). Start with the id of a run that is still "
                "there (not yet downloaded) follows it instead of starting a new one.",
            ),
        ),
    ),
    (
        "RunPod",
        (
            CloudField("create", "Create pod", "Create a pod when no pod id is given.", kind="bool"),
            CloudField("name", "Pod name", "The name of a created pod."),
            CloudField("gpu_type", "GPU type", "A created pod's GPU, e.g. NVIDIA RTX A5000."),
            CloudField(
                "sub_type",
                "Cloud type",
                "RunPod's secure or community cloud for a created pod; ANY: either.",
                kind="choice",
                choices=SUB_TYPES,
            ),
            CloudField("volume_size", "Volume (GB)", "A created pod's volume, mounted at /workspace.", kind="int"),
            CloudField("min_download", "Min. download (Mbps)", "A created pod's least download speed.", kind="int"),
        ),
    ),
    (
        "Downloads",
        (
            CloudField(
                "download_samples",
                "Samples",
                "Each sample into workspace/samples here as it is made.",
                kind="bool",
            ),
            CloudField(
                "download_output_model",
                "Output model",
                "The trained model to the output destination at the end.",
                kind="bool",
            ),
            CloudField("download_saves", "Saves", "The saves into workspace/save at the end.", kind="bool"),
            CloudField("download_backups", "Backups", "The backups into workspace/backup at the end.", kind="bool"),
            CloudField(
                "download_tensorboard",
                "Host's TensorBoard files",
                "The host's own event files into workspace/tensorboard-host (the streamed ones are written here "
                "anyway).",
                kind="bool",
            ),
            CloudField(
                "delete_workspace",
                "Delete the run on the host",
                "Remove the run's folder on the host once its outputs are here.",
                kind="bool",
            ),
        ),
    ),
    (
        "Actions",
        (
            CloudField("on_finish", "On finish", _actions("when the run ends"), kind="choice", choices=ACTIONS),
            CloudField("on_error", "On error", _actions("when the run fails"), kind="choice", choices=ACTIONS),
            CloudField(
                "on_detached_finish",
                "On detached finish",
                _actions("when a detached run ends (nothing was downloaded)"),
                kind="choice",
                choices=ACTIONS,
            ),
            CloudField(
                "on_detached_error",
                "On detached error",
                _actions("when a detached run fails"),
                kind="choice",
                choices=ACTIONS,
            ),
        ),
    ),
)
# The groups of each column.
LAYOUT = (("Connection",), ("Run", "Actions"), ("Downloads", "RunPod"))
CLOUD_DEFAULTS = {f.name: getattr(CloudSettings(), f.name) for f in fields(CloudSettings)}
REATTACH_TEXT = (
    "Follow the host's run of this run id (the app or the connection was closed, or it was detached): from its first "
    "step, then its outputs are downloaded. Never starts a run: a host without it says so. (Start also follows a run "
    "that is still there, and starts one when there is none.)"
)


class CloudInput:
    """One setting's label and input; `get` reads the widget, `show` puts a value into it without writing."""

    def __init__(self, parent: Any, row: int, field: CloudField, on_edit: Callable[[CloudInput], None]) -> None:
        self.field = field
        self.on_edit = on_edit
        self.loading = False
        self.error: str | None = None
        self.label = ctk.CTkLabel(parent, text=field.label, anchor="w", justify="left", wraplength=LABEL_WIDTH)
        self.label.grid(row=row, column=0, sticky="w", padx=(10, 8), pady=3)
        self.var: ctk.StringVar | None = None
        if field.kind == "bool":
            self.widget: Any = ctk.CTkSwitch(parent, text="", width=44, command=self._edited)
            self.widget.grid(row=row, column=1, sticky="w", padx=(0, 10), pady=3)
        elif field.kind == "choice":
            labels = [CHOICE_LABELS.get(value, value) for value in field.choices]
            self.widget = ctk.CTkOptionMenu(parent, values=labels, width=140, command=self._edited)
            self.widget.grid(row=row, column=1, sticky="w", padx=(0, 10), pady=3)
        else:
            self.var = ctk.StringVar()
            show = MASK if field.kind == "password" else ""
            width = 100 if field.kind == "int" else 220
            self.widget = ctk.CTkEntry(parent, textvariable=self.var, show=show, width=width)
            self.widget.grid(row=row, column=1, sticky="w" if field.kind == "int" else "ew", padx=(0, 10), pady=3)
            self._border = self.widget.cget("border_color")
            self.var.trace_add("write", lambda *_: self._edited())
        self.tooltips = add_tooltip([self.label, self.widget], self.tooltip_text)

    def tooltip_text(self) -> str:
        where = "the secrets file" if self.field.store == SECRET else f"cloud.{self.field.key}"
        text = f"{self.field.tooltip}\n({where})"
        return f"{self.error}\n\n{text}" if self.error else text

    def _edited(self, *_: Any) -> None:
        if not self.loading:
            self.on_edit(self)

    def get(self) -> Any:
        if self.field.kind == "bool":
            return bool(self.widget.get())
        if self.field.kind == "choice":
            shown = self.widget.get()
            return next((value for value in self.field.choices if CHOICE_LABELS.get(value, value) == shown), shown)
        return self.var.get()

    def show(self, value: Any) -> None:
        self.loading = True
        try:
            if self.field.kind == "bool":
                (self.widget.select if value else self.widget.deselect)()
            elif self.field.kind == "choice":
                self.widget.set(CHOICE_LABELS.get(str(value), str(value)))
            elif self.field.kind == "int" and self.field.store == SECRET:
                self.var.set(str(value) if value else "")
            else:
                self.var.set("" if value is None else str(value))
        finally:
            self.loading = False
        self.mark(None)

    def set_text(self, text: str) -> None:
        """Type `text` into an entry (as the user does: the edit is written)."""
        self.var.set(text)

    def mark(self, error: str | None) -> None:
        self.error = error
        if self.var is not None:
            self.widget.configure(border_color=ERROR_BORDER if error else self._border)


class CloudTab(FormTab):
    columns = 1

    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "cloud", host: TabHost | None = None
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        body = ctk.CTkFrame(self.scroll, fg_color="transparent")
        body.grid(row=1, column=0, sticky="ew")
        self.inputs: dict[str, CloudInput] = {}
        self.groups: dict[str, Group] = {}
        specs = dict(GROUPS)
        for c, titles in enumerate(LAYOUT):
            body.grid_columnconfigure(c, weight=1, uniform="cloud-column")
            column = ctk.CTkFrame(body, fg_color="transparent")
            column.grid(row=0, column=c, sticky="new", padx=4)
            column.grid_columnconfigure(0, weight=1)
            for r, title in enumerate(titles):
                group = self.groups[title] = Group(column, title)
                group.frame.grid(row=r, column=0, sticky="ew", pady=(4, 8))
                for row, field in enumerate(specs[title], start=1):
                    self.inputs[field.key] = CloudInput(group.frame, row, field, self._edited)
        run = self.groups["Run"].frame
        self.reattach_button = ctk.CTkButton(run, text="Reattach now", width=130, command=self.reattach)
        self.reattach_button.grid(row=len(specs["Run"]) + 1, column=1, sticky="w", padx=(0, 10), pady=(3, 10))
        add_tooltip(self.reattach_button, REATTACH_TEXT)
        connection = self.groups["Connection"].frame
        self.secrets_note = ctk.CTkLabel(
            connection, text="", text_color=MUTED_TEXT, anchor="w", justify="left", wraplength=LABEL_WIDTH + 200
        )
        self.secrets_note.grid(row=len(specs["Connection"]) + 1, column=0, columnspan=2, sticky="w", padx=10, pady=6)
        self.secrets_error: str | None = None
        self.refresh()  # later, the app refreshes the tab when the config was replaced (`App._bring_up_to_date`)

    # -- showing ---------------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        super().refresh()
        cloud = self.model.config.cloud if isinstance(self.model.config.cloud, dict) else {}
        for key, view in self.inputs.items():
            if view.field.store == CONFIG:
                value = cloud.get(key)
                view.show(CLOUD_DEFAULTS[key] if value is None else value)
                self.model.report_input(view, f"cloud.{key}", None)  # the text that was refused is gone
        self.load_secrets()

    def load_secrets(self) -> None:
        """Show the secrets file's `cloud` values (the password and API key masked)."""
        path = secrets_path()
        try:
            data = read_secrets_file(path)
            secrets = CloudSecrets.from_dict(data.get("cloud"), str(path))
        except CloudError as e:
            self.secrets_error = str(e)
            secrets = CloudSecrets()
        else:
            self.secrets_error = None
        for key, view in self.inputs.items():
            if view.field.store == SECRET:
                view.show(getattr(secrets, key))
                self.model.report_input(view, f"cloud.{key}", None)
        self._show_note()

    def _show_note(self) -> None:
        if self.secrets_error:
            self.secrets_note.configure(text=f"{self.secrets_error}; nothing is saved there", text_color=ERROR_TEXT)
        else:
            text = "Host, port, user, key file, password, API key and pod id are saved in the secrets file (only "
            text += f"you can read it), never in the config:\n{secrets_path()}"
            self.secrets_note.configure(text=text, text_color=MUTED_TEXT)

    # -- editing ---------------------------------------------------------------------------------------------------

    def _edited(self, view: CloudInput) -> None:
        field = view.field
        text = view.get()
        try:
            value = _parse(field, text)
            if field.store == CONFIG:
                CloudSettings.from_dict({field.key: value})  # the core's own check, naming the field
        except CloudError as e:
            view.mark(str(e))
            self.model.report_input(view, f"cloud.{field.key}", str(e))
            return
        view.mark(None)
        self.model.report_input(view, f"cloud.{field.key}", None)
        if field.store == CONFIG:
            cloud = dict(self.model.config.cloud) if isinstance(self.model.config.cloud, dict) else {}
            cloud[field.key] = value
            self.model.config.cloud = cloud
            self.model.changed(f"cloud.{field.key}")
        else:
            self._save_secret(view, value)

    def _save_secret(self, view: CloudInput, value: Any) -> None:
        """Write one value into the secrets file, keeping what else it holds (the Hugging Face token, …)."""
        path = secrets_path()
        try:
            data = read_secrets_file(path)
        except CloudError as e:  # unreadable or readable by others: never overwritten, the user fixes it
            self.secrets_error = str(e)
            self._show_note()
            return
        cloud = dict(data["cloud"]) if isinstance(data.get("cloud"), dict) else {}
        if value in ("", 0):  # an emptied field leaves the file: its default applies (user root, port 22)
            cloud.pop(view.field.key, None)
        else:
            cloud[view.field.key] = value
        data["cloud"] = cloud
        try:
            write_secrets_file(data, path)
        except OSError as e:
            self.secrets_error = f"the secrets file {path} cannot be written ({type(e).__name__})"
        else:
            self.secrets_error = None
        self._show_note()

    def reattach(self) -> bool:
        """Follow the host's run of the config's run id (`App.start(reattach=True)`: `cloud.attach_only`)."""
        cloud = self.model.config.cloud if isinstance(self.model.config.cloud, dict) else {}
        host = self.host
        if not cloud.get("enabled"):
            if host is not None and hasattr(host, "footer"):
                host.footer.set_status("Reattach: turn on Train remotely first (the cloud tab).", "warning")
            return False
        if host is None or not hasattr(host, "start"):
            return False
        if getattr(host, "running", False):  # the app's Start would stop it
            host.footer.set_status("Reattach: a run is going on; stop it first.", "warning")
            return False
        return bool(host.start(reattach=True))


def _parse(field: CloudField, text: Any) -> Any:
    """The value of an input's text, refused with a message naming the field."""
    if field.kind != "int":
        return text
    stripped = text.strip()
    if not stripped and field.store == SECRET:
        return 0
    name = f"secrets: cloud.{field.key}" if field.store == SECRET else f"cloud.{field.key}"
    try:
        value = int(stripped)
    except ValueError:
        raise CloudError(f"{name}: {text!r} is not a whole number") from None
    if value < 0 or (field.key == "port" and not 0 < value <= 65535):
        raise CloudError(f"{name}: {value} is out of range")
    return value
