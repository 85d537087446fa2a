"""scripts/install_torch.py: which torch build is chosen (no real install), and the install scripts' basics."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_install_torch():
    path = ROOT / "scripts" / "install_torch.py"
    spec = importlib.util.spec_from_file_location("install_torch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is created
    spec.loader.exec_module(module)
    return module


it = _load_install_torch()

PIN = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def smi(cuda: str, driver: str = "570.86.15") -> str:
    """A realistic nvidia-smi header for a driver that supports CUDA `cuda`."""
    return f"""Sat Nov 22 03:31:07 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA GeForce RTX 4090        Off |   00000000:01:00.0  On |                  Off |
+-----------------------------------------+------------------------+----------------------+
"""


# --- the pure decision -------------------------------------------------------------------------------------


def test_pin():
    assert it.TORCH_VERSION == "2.13.0"
    assert it.TORCH_REQUIREMENT == PIN


@pytest.mark.parametrize("cuda", ["12.8", "12.9"])
def test_driver_cuda_12_8_or_later_picks_cu128(cuda):
    choice = it.choose_torch("linux", smi(cuda), {})
    assert choice.variant == "cu128"
    assert choice.pip_args == (PIN, "--index-url", "https://download.pytorch.org/whl/cu128")
    assert choice.index_url == "https://download.pytorch.org/whl/cu128"
    assert cuda in choice.reason
    assert choice.warning is None


@pytest.mark.parametrize("cuda", ["13.0", "13.1", "13.2"])
def test_driver_cuda_13_picks_cu130(cuda):
    choice = it.choose_torch("linux", smi(cuda, "580.65.06"), {})
    assert choice.variant == "cu130"
    assert choice.pip_args == (PIN, "--index-url", "https://download.pytorch.org/whl/cu130")


@pytest.mark.parametrize("cuda", ["12.6", "12.7"])
def test_driver_cuda_12_6_picks_cu126(cuda):
    assert it.choose_torch("linux", smi(cuda), {}).variant == "cu126"


def test_windows_with_driver_picks_cuda_too():
    choice = it.choose_torch("win32", smi("12.8"), {})
    assert choice.pip_args == (PIN, "--index-url", "https://download.pytorch.org/whl/cu128")


def test_future_driver_picks_newest_variant():
    assert it.choose_torch("linux", smi("14.1"), {}).variant == it.CUDA_VARIANTS[0][0]


@pytest.mark.parametrize("cuda", ["12.4", "11.8", "12.5"])
def test_too_old_driver_falls_back_to_cpu_with_message(cuda):
    choice = it.choose_torch("linux", smi(cuda, "550.54.14"), {})
    assert choice.variant == "cpu"
    assert choice.pip_args == (PIN, "--extra-index-url", CPU_INDEX)
    assert choice.warning is not None
    assert cuda in choice.warning
    assert "CPU" in choice.warning
    assert "driver" in choice.warning.lower()
    assert "too old" in choice.reason


@pytest.mark.parametrize("platform", ["linux", "win32"])
def test_no_nvidia_smi_gives_cpu_build_from_cpu_index(platform):
    choice = it.choose_torch(platform, None, {})
    assert choice.variant == "cpu"
    assert choice.pip_args == (PIN, "--extra-index-url", CPU_INDEX)
    assert choice.index_url == CPU_INDEX
    assert choice.warning is None


@pytest.mark.parametrize(
    "output",
    [
        "",
        "No devices were found\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    ],
)
def test_nvidia_smi_without_gpu_gives_cpu(output):
    choice = it.choose_torch("linux", output, {})
    assert choice.variant == "cpu"
    assert choice.pip_args == (PIN, "--extra-index-url", CPU_INDEX)


def test_driver_reporting_no_cuda_version_gives_cpu_with_message():
    choice = it.choose_torch("linux", smi("N/A"), {})
    assert choice.variant == "cpu"
    assert choice.warning is not None
    assert "ONETRAINER_TORCH=cuda" in choice.warning


@pytest.mark.parametrize("output", [None, smi("12.8")])
def test_macos_gets_plain_pinned_torch(output):
    choice = it.choose_torch("darwin", output, {})
    assert choice.pip_args == (PIN,)
    assert choice.index_url is None
    assert choice.variant == "default"


def test_override_cpu_ignores_the_driver():
    choice = it.choose_torch("linux", smi("13.0"), {"ONETRAINER_TORCH": "cpu"})
    assert choice.pip_args == (PIN, "--extra-index-url", CPU_INDEX)
    assert "ONETRAINER_TORCH" in choice.reason


def test_override_cuda_uses_the_best_variant_the_driver_supports():
    assert it.choose_torch("linux", smi("12.8"), {"ONETRAINER_TORCH": "CUDA"}).variant == "cu128"


@pytest.mark.parametrize("output", [None, smi("12.4")])
def test_override_cuda_without_a_fitting_driver_uses_the_oldest_variant(output):
    choice = it.choose_torch("linux", output, {"ONETRAINER_TORCH": "cuda"})
    assert choice.variant == "cu126"
    assert choice.pip_args == (PIN, "--index-url", "https://download.pytorch.org/whl/cu126")


def test_override_exact_variant():
    choice = it.choose_torch("linux", smi("13.0"), {"ONETRAINER_TORCH": "cu126"})
    assert choice.pip_args == (PIN, "--index-url", "https://download.pytorch.org/whl/cu126")


def test_override_cuda_on_macos_is_ignored_with_a_message():
    choice = it.choose_torch("darwin", None, {"ONETRAINER_TORCH": "cuda"})
    assert choice.pip_args == (PIN,)
    assert choice.warning is not None


def test_override_index_wins_over_everything():
    url = "https://mirror.example/whl/cu128"
    for platform, output in [("linux", None), ("linux", smi("13.0")), ("darwin", None)]:
        choice = it.choose_torch(platform, output, {"ONETRAINER_TORCH_INDEX": url, "ONETRAINER_TORCH": "cpu"})
        assert choice.pip_args == (PIN, "--index-url", url)
        assert "ONETRAINER_TORCH_INDEX" in choice.reason


@pytest.mark.parametrize("value", ["", "auto", "  "])
def test_empty_or_auto_override_means_automatic(value):
    env = {"ONETRAINER_TORCH": value, "ONETRAINER_TORCH_INDEX": ""}
    assert it.choose_torch("linux", smi("12.8"), env).variant == "cu128"


def test_unknown_override_is_an_error():
    with pytest.raises(ValueError, match="ONETRAINER_TORCH"):
        it.choose_torch("linux", None, {"ONETRAINER_TORCH": "rocm"})


def test_the_pin_is_always_the_requirement():
    cases = [None, "", smi("11.8"), smi("12.4"), smi("12.6"), smi("12.8"), smi("13.0"), smi("N/A")]
    envs = [{}, {"ONETRAINER_TORCH": "cpu"}, {"ONETRAINER_TORCH": "cuda"}, {"ONETRAINER_TORCH_INDEX": "https://x/y"}]
    for platform in ("linux", "win32", "darwin"):
        for output in cases:
            for env in envs:
                choice = it.choose_torch(platform, output, env)
                requirements = [a for a in choice.pip_args if not a.startswith("-") and "://" not in a]
                assert requirements == [PIN], (platform, output, env, choice)
                assert choice.reason


def test_parse_driver_cuda_version():
    assert it.parse_driver_cuda_version(smi("12.8")) == (12, 8)
    assert it.parse_driver_cuda_version(smi("13.0")) == (13, 0)
    assert it.parse_driver_cuda_version("CUDA Version:12.10") == (12, 10)
    assert it.parse_driver_cuda_version(smi("N/A")) is None
    assert it.parse_driver_cuda_version(None) is None


# --- already installed? ---------------------------------------------------------------------------------------


def test_installed_matches():
    cpu = it.choose_torch("linux", None, {})
    cuda = it.choose_torch("linux", smi("12.8"), {})
    mac = it.choose_torch("darwin", None, {})
    assert it.installed_matches("2.13.0+cpu", cpu)
    assert it.installed_matches("2.13.0", cpu)  # PyPI's Linux build (CUDA) also runs on CPU
    assert it.installed_matches("2.13.0+cu128", cuda)
    assert it.installed_matches("2.13.0+cu126", cuda)
    assert it.installed_matches("2.13.0", mac)
    assert not it.installed_matches("2.13.0+cpu", cuda)  # would leave the GPU unused
    assert not it.installed_matches(None, cpu)
    assert not it.installed_matches("2.12.1+cpu", cpu)
    assert not it.installed_matches("2.15.0", mac)


def test_unreachable_cpu_index_is_dropped_but_cuda_index_kept():
    cpu = it.choose_torch("linux", None, {})
    assert it.drop_unreachable_index(cpu, True) == cpu
    dropped = it.drop_unreachable_index(cpu, False)
    assert dropped.pip_args == (PIN,)
    assert dropped.warning is not None and "download.pytorch.org" in dropped.warning
    cuda = it.choose_torch("linux", smi("12.8"), {})
    assert it.drop_unreachable_index(cuda, False) == cuda


def test_dry_run_prints_the_command_and_installs_nothing(tmp_path):
    """main() end to end against this interpreter, without nvidia-smi and forcing a CUDA build: only prints."""
    env = {**os.environ, "ONETRAINER_TORCH": "cu128", "PATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install_torch.py"), "--python", sys.executable, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cu128" in proc.stdout
    if "already installed" not in proc.stdout:
        assert "-m pip install torch==2.13.0" in proc.stdout
        assert "--index-url https://download.pytorch.org/whl/cu128" in proc.stdout


# --- the scripts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["install.sh", "start-ui.sh", "scripts/test.sh", ".ci/run"])
def test_shell_scripts_are_executable_and_parse(script):
    path = ROOT / script
    assert path.is_file(), script
    assert os.access(path, os.X_OK), f"{script} is not executable (chmod +x)"
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_installer_that_start_ui_runs_says_the_app_starts(tmp_path):
    """start-ui.sh installs on first use and then starts the app itself: the installer it runs says the app starts,
    where run by the user it says how to start it."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    # start-ui.sh as it is, with a stand-in installer and an interpreter that imports nothing until "installed"
    shutil.copy(ROOT / "start-ui.sh", tmp_path / "start-ui.sh")
    installed = tmp_path / "installed"
    (tmp_path / "install.sh").write_text(
        f'#!/usr/bin/env bash\necho "told: ${{ONETRAINER_STARTING_APP:-no}}"\ntouch {installed}\n'
    )
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text(f'#!/usr/bin/env bash\n[ -f {installed} ] && echo "python $*"\n')
    for script in (tmp_path / "install.sh", tmp_path / ".venv" / "bin" / "python"):
        script.chmod(0o755)
    started = subprocess.run([bash, str(tmp_path / "start-ui.sh")], capture_output=True, text=True, timeout=60)
    assert "told: 1" in started.stdout and "python scripts/train_ui.py" in started.stdout, started.stdout
    # the real installer's last step, run by start-ui.sh and by the user
    text = (ROOT / "install.sh").read_text(encoding="utf-8")
    last_step = 'say() { printf "==> %s\\n" "$*"; }\n' + text[text.index("# --- 4. ") :]
    env = {k: v for k, v in os.environ.items() if k != "ONETRAINER_STARTING_APP"}
    by_start_ui = subprocess.run(
        [bash, "-euc", last_step], capture_output=True, text=True, env={**env, "ONETRAINER_STARTING_APP": "1"}
    )
    by_user = subprocess.run([bash, "-euc", last_step], capture_output=True, text=True, env=env)
    assert by_start_ui.stdout.startswith("==> Done. Starting the app") and "./start-ui.sh" not in by_start_ui.stdout
    assert "Start the app: ./start-ui.sh" in by_user.stdout
    # Windows: the same, in the batch files
    start_bat, install_bat = ((ROOT / name).read_text(encoding="utf-8") for name in ("start-ui.bat", "install.bat"))
    assert 'set "ONETRAINER_STARTING_APP=1"\ncall "%~dp0install.bat"' in start_bat
    assert 'if "%ONETRAINER_STARTING_APP%"=="1" (\n    echo ==^> Done. Starting the app' in install_bat


def test_ci_runs_the_test_script():
    text = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in text
    assert "xvfb" in text


def test_windows_scripts_exist_with_crlf():
    for name in ("install.bat", "start-ui.bat"):
        data = (ROOT / name).read_bytes()
        assert b"\r\n" in data and data.count(b"\n") == data.count(b"\r\n"), f"{name} needs CRLF line endings"
    assert b"scripts\\install_torch.py" in (ROOT / "install.bat").read_bytes()


def test_install_silences_only_setuptools_license_classifier_box():
    """dadaptation's source build makes setuptools print a deprecation box; the install scripts' filter hides it."""
    pytest.importorskip("setuptools.warnings")  # a venv of Python 3.12+ may have no setuptools of its own
    line = next(ln for ln in (ROOT / "install.sh").read_text().splitlines() if ln.startswith("export PYTHONWARNINGS="))
    value = line.split("=", 1)[1].strip('"')
    assert f'set "PYTHONWARNINGS={value}"' in (ROOT / "install.bat").read_text()
    emit = (
        "from setuptools.warnings import SetuptoolsDeprecationWarning as W\n"
        "W.emit('License classifiers are deprecated.', 'Please consider removing the following classifiers')\n"
        "W.emit('Another deprecation.', 'still shown')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    loud = subprocess.run([sys.executable, "-c", emit], capture_output=True, text=True, env=env, check=True)
    assert "!!" in loud.stderr and "License classifiers" in loud.stderr
    quiet = subprocess.run(
        [sys.executable, "-c", emit], capture_output=True, text=True, env={**env, "PYTHONWARNINGS": value}, check=True
    )
    assert "License classifiers" not in quiet.stderr and "Another deprecation" in quiet.stderr


@pytest.mark.parametrize("script", ["install.sh", "install.bat"])
def test_the_installers_warning_filter_silences_setuptools_boxes_and_nothing_else(script):
    """The PYTHONWARNINGS the installer sets, applied to the warnings setuptools raises while pip builds (pip shows the
    editable install's as a "BuildBackendWarning" box): those two are silent, another warning still shows."""
    import re

    text = (ROOT / script).read_text(encoding="utf-8")
    value = re.search(r'PYTHONWARNINGS="?(ignore[^"\n]*)"', text).group(1)
    boxes = [
        "Editable installation.\n!!\n\n        ****\n        Please be careful with folders in your working directory "
        "with the same\n        name as your package as they may take precedence during imports.\n",
        "License classifiers are deprecated.\n!!\n\n        ****\n        Please consider removing the following "
        "classifiers in favor of a SPDX license expression:\n",
    ]
    code = "import warnings\n" + "".join(f"warnings.warn({box!r}, UserWarning)\n" for box in boxes)
    code += "warnings.warn('a warning that matters', UserWarning)\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": value}
    )
    assert "Editable installation" not in result.stderr and "License classifiers" not in result.stderr
    assert "a warning that matters" in result.stderr
