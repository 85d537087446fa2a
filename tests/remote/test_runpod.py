"""RUNPOD behind the same interface as LINUX (`onetrainer/remote/runpod.py`): its API calls against a stand-in of
RunPod's REST API on 127.0.0.1, and one tiny run through it onto the loopback sshd (conftest.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.remote import run as remote_run
from onetrainer.remote import runpod
from onetrainer.remote.settings import CloudError, CloudSecrets, CloudSettings, read_secrets_file, write_secrets_file
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, ListSink, Progress, Status
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config

API_KEY = "rpa_TESTKEY_0123456789"
ROOT = Path(__file__).resolve().parents[2]


class StandIn:
    """RunPod's pods endpoints as far as the provider uses them; a new or started pod has no address on its first
    look (it is provisioning), then the loopback sshd's."""

    def __init__(self, ssh_port: int) -> None:
        self.ssh_port = ssh_port
        self.pods: dict[str, dict] = {}
        self.calls: list[tuple[str, str, dict | None]] = []
        self.looks: dict[str, int] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: dict | None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stand_in.calls.append((method, self.path, body))
                if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                    self._answer(401, {"error": "invalid api key"})
                    return
                self._answer(*stand_in.route(method, self.path, body))

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_DELETE(self):
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, method: str, path: str, body: dict | None) -> tuple[int, dict | None]:
        parts = path.removeprefix("/v1/").split("/")
        if method == "POST" and parts == ["pods"]:
            pod_id = f"pod{len(self.pods) + 1}"
            self.pods[pod_id] = {"id": pod_id, "desiredStatus": "RUNNING", "publicIp": None, "portMappings": {}}
            return 201, self.pods[pod_id]
        pod = self.pods.get(parts[1]) if len(parts) > 1 else None
        if pod is None:
            return 404, {"error": "pod not found"}
        if method == "GET":
            self.looks[pod["id"]] = self.looks.get(pod["id"], 0) + 1
            if pod["desiredStatus"] == "RUNNING" and self.looks[pod["id"]] > 2:
                pod.update(publicIp="127.0.0.1", portMappings={"22": self.ssh_port})
            return 200, pod
        if method == "POST" and parts[2:] == ["start"]:
            pod["desiredStatus"] = "RUNNING"
            self.looks[pod["id"]] = 0
            return 200, pod
        if method == "POST" and parts[2:] == ["stop"]:
            pod.update(desiredStatus="EXITED", publicIp=None, portMappings={})
            return 200, pod
        if method == "DELETE":
            del self.pods[pod["id"]]
            return 204, None
        return 400, {"error": "unexpected call"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(ssh_server, monkeypatch):
    stand_in = StandIn(ssh_server.port)
    monkeypatch.setenv(runpod.API_ENV, stand_in.url)
    monkeypatch.setattr(runpod, "POLL_SECONDS", 0.05)
    yield stand_in
    stand_in.close()


def _settings(**changes) -> CloudSettings:
    return CloudSettings.from_dict({"type": "RUNPOD", "gpu_type": "NVIDIA RTX A5000", "create": True, **changes})


def test_a_pod_is_created_waited_for_stopped_started_and_deleted(api, ssh_server, tmp_path):
    secrets_file = write_secrets_file(ssh_server.secrets(host="", port=0, api_key=API_KEY), tmp_path / "s.json")
    secrets = CloudSecrets.from_dict(read_secrets_file(secrets_file)["cloud"], "s")
    provider = runpod.RunPodProvider(_settings(volume_size=50, sub_type="SECURE"), secrets, secrets_file)
    events = ListSink()
    host = provider.prepare(events)
    assert (host.host, host.port, host.user) == ("127.0.0.1", ssh_server.port, ssh_server.user)
    method, path, body = api.calls[0]
    assert (method, path) == ("POST", "/v1/pods")
    assert body["gpuTypeIds"] == ["NVIDIA RTX A5000"] and body["volumeInGb"] == 50 and body["cloudType"] == "SECURE"
    assert body["ports"] == ["22/tcp"] and body["supportPublicIp"] is True
    assert body["env"]["PUBLIC_KEY"] == (ssh_server.key_file.with_name("user_key.pub")).read_text().strip()
    assert read_secrets_file(secrets_file)["cloud"]["id"] == "pod1"  # a restart finds the same pod
    assert any("waiting for the pod pod1" in e.text for e in events.of(Status))

    provider.act("STOP", events, "cloud.on_finish")
    assert api.calls[-1][:2] == ("POST", "/v1/pods/pod1/stop") and api.pods["pod1"]["desiredStatus"] == "EXITED"
    again = runpod.RunPodProvider(_settings(), CloudSecrets.from_dict(read_secrets_file(secrets_file)["cloud"], "s"))
    assert again.prepare(events).port == ssh_server.port  # the stopped pod was started, not another created
    assert ("POST", "/v1/pods/pod1/start", None) in api.calls and list(api.pods) == ["pod1"]
    again.act("DELETE", events, "cloud.on_error")
    assert api.pods == {} and api.calls[-1][:2] == ("DELETE", "/v1/pods/pod1")


def test_a_wrong_api_key_or_pod_is_named_without_the_key(api, ssh_server, tmp_path):
    wrong = CloudSecrets(api_key="rpa_WRONG_KEY_42", user="root")
    with pytest.raises(CloudError, match=r"HTTP 401 \(secrets: cloud\.api_key\)") as refused:
        runpod.RunPodProvider(_settings(), wrong, tmp_path / "s.json").prepare(ListSink())
    assert "rpa_WRONG_KEY_42" not in str(refused.value)
    missing = CloudSecrets(api_key=API_KEY, id="nosuchpod")
    with pytest.raises(CloudError, match=r"secrets: cloud\.id: RunPod has no pod 'nosuchpod'"):
        runpod.RunPodProvider(_settings(create=False), missing).prepare(ListSink())
    with pytest.raises(CloudError, match=r"cloud\.api_key is empty"):
        runpod.RunPodProvider(_settings(), CloudSecrets())


@pytest.mark.slow
def test_a_run_on_a_created_pod_stops_it_at_the_end(api, ssh_server, tmp_path, tmp_path_factory, monkeypatch):
    """The same remote run as LINUX's, its host from the API; `on_finish` STOP stops the pod after the download."""
    secrets_file = write_secrets_file(ssh_server.secrets(host="", port=0, api_key=API_KEY), tmp_path / "s.json")
    monkeypatch.setenv("ONETRAINER_SECRETS", str(secrets_file))
    base = tmp_path_factory.getbasetemp()
    env = {"XDG_CACHE_HOME": str(base / "xdg-cache"), "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv(remote_run.REMOTE_ENV, json.dumps({**env, "ONETRAINER_STATE_DIR": str(tmp_path / "hs")}))
    image_folder(tmp_path)
    cloud = {
        "enabled": True,
        "type": "RUNPOD",
        "create": True,
        "gpu_type": "NVIDIA RTX A5000",
        "remote_dir": str(tmp_path / "pod"),
        "huggingface_cache_dir": str(tmp_path / "pod" / "hf"),
        "onetrainer_dir": str(ROOT),
        "install_cmd": "",
        "update_onetrainer": False,
        "run_id": "pod-run",
        "on_finish": "STOP",
    }
    config, _ = config_from_dict(tiny_config(tmp_path, epochs=1, cloud=cloud))
    sink = ListSink()
    outcome = run_training(config, TrainingControl(), [sink])
    assert isinstance(outcome, Finished), outcome if isinstance(outcome, Failed) else None
    assert sink.of(Progress) and (tmp_path / "out" / "lora.safetensors").is_file()
    assert api.pods["pod1"]["desiredStatus"] == "EXITED"
    assert any("stopped the pod pod1" in e.text for e in sink.of(Status))
    assert API_KEY not in json.dumps((tmp_path / "pod" / "runs" / "pod-run" / "config.json").read_text())
