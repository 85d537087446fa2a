"""An OpenSSH server on 127.0.0.1 for the remote-training tests: `sshd -D` with its own config, a throwaway host key and
user key in a temp folder, run as the current user (nothing system-wide changes; `.ci/run` installs OpenSSH)."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PASSPHRASE = "s3cret-Passphrase-9f2c"  # the user key's passphrase: the secret the tests look for in every file


@dataclass
class SshServer:
    host: str
    port: int
    user: str
    key_file: Path
    host_key: Path
    folder: Path

    def secrets(self, **changes) -> dict:
        cloud = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_file": str(self.key_file),
            "password": PASSPHRASE,
        }
        return {"cloud": {**cloud, **changes}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, passphrase: str = "") -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path), "-C", "onetrainer-test"], check=True
    )


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory) -> SshServer:
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH's server is not installed (apt-get install openssh-server; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("sshd")
    host_key, user_key = folder / "host_key", folder / "user_key"
    _keygen(host_key)
    _keygen(user_key, PASSPHRASE)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    port = _free_port()
    root = os.geteuid() == 0
    config = folder / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {folder / 'sshd.pid'}",
                f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication yes",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                f"PermitRootLogin {'yes' if root else 'no'}",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    if root:  # sshd run by root wants its privilege separation folder (Debian's package creates it at boot)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = (folder / "sshd.log").open("w")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")
        time.sleep(0.1)
    yield SshServer("127.0.0.1", port, getpass.getuser(), user_key, host_key, folder)
    process.terminate()
    process.wait(10)
    log.close()
