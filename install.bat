@echo off
rem Install OneTrainer into .venv (Windows).
rem
rem   install.bat          the app
rem   install.bat --dev    the app plus the test tools (pytest, ruff)
rem
rem Environment: PYTHON picks the interpreter (3.10 to 3.13), either a path or a command such as "py -3.12";
rem ONETRAINER_TORCH (cpu, cuda, cu128 ...) and ONETRAINER_TORCH_INDEX (an index URL) override the torch build,
rem see scripts\install_torch.py. Safe to run again: pip only installs what is missing.
setlocal EnableExtensions DisableDelayedExpansion
cd /d "%~dp0"
set "ROOT=%CD%"
set "VENV_PY=%ROOT%\.venv\Scripts\python.exe"
set "PIP_DISABLE_PIP_VERSION_CHECK=1"
rem dadaptation's setup.py names its license by classifier: setuptools prints a deprecation box when it builds the
rem wheel; the editable install of OneTrainer prints another ("BuildBackendWarning: Editable installation."). Only
rem those two warnings are ignored.
set "PYTHONWARNINGS=ignore:License classifiers are deprecated,ignore:Editable installation"
set "PYCHECK=import sys; v = sys.version_info[:2]; print(*v, sep='.'); sys.exit(0 if (3, 10) <= v < (3, 14) else 1)"

set "DEV=0"
:parse
if "%~1"=="" goto :parsed
if /i "%~1"=="--dev" (
    set "DEV=1"
) else if /i "%~1"=="--help" (
    goto :usage
) else if /i "%~1"=="-h" (
    goto :usage
) else (
    echo install.bat: unknown option "%~1", use --dev or --help 1>&2
    exit /b 2
)
shift
goto :parse
:parsed

rem --- 1. the interpreter and the virtual environment ----------------------------------------------------
if exist "%VENV_PY%" goto :have_venv
if exist "%ROOT%\.venv\" (
    echo ERROR: .venv exists but has no Scripts\python.exe. Delete the .venv folder and run install.bat again. 1>&2
    exit /b 1
)

set "PY="
if defined PYTHON goto :python_from_env
for %%V in (3.13 3.12 3.11 3.10) do if not defined PY call :try_python py -%%V
if not defined PY call :try_python python
if not defined PY call :try_python python3
if not defined PY (
    echo ERROR: No Python 3.10 to 3.13 found ^(tried py -3.13 ... py -3.10, python, python3^). 1>&2
    echo        Install Python 3.12 from https://www.python.org/downloads/windows/ with the "tcl/tk" and 1>&2
    echo        "py launcher" options, or point PYTHON at one:  set PYTHON=C:\Path\To\python.exe 1>&2
    exit /b 1
)
goto :make_venv

:python_from_env
call :try_python %PYTHON%
if defined PY goto :make_venv
echo ERROR: PYTHON=%PYTHON% is not a working Python 3.10 to 3.13. 1>&2
exit /b 1

:make_venv
echo ==^> Creating the virtual environment .venv with %PY%
%PY% -m venv "%ROOT%\.venv"
if errorlevel 1 (
    if exist "%ROOT%\.venv\" rmdir /s /q "%ROOT%\.venv"
    echo. 1>&2
    echo ERROR: creating the virtual environment .venv failed, see the error above. 1>&2
    exit /b 1
)
echo ==^> Upgrading pip
"%VENV_PY%" -m pip install --quiet --upgrade pip
if errorlevel 1 (
    echo. 1>&2
    echo ERROR: upgrading pip in .venv failed, see pip's error above. 1>&2
    exit /b 1
)
goto :venv_ready

:have_venv
"%VENV_PY%" -c "%PYCHECK%" >nul 2>&1
if errorlevel 1 (
    echo ERROR: .venv does not hold a working Python 3.10 to 3.13. Delete the .venv folder and run install.bat again. 1>&2
    exit /b 1
)
echo ==^> Using the existing virtual environment .venv

:venv_ready
"%VENV_PY%" -c "import tkinter" >nul 2>&1
if errorlevel 1 (
    echo WARNING: this Python has no tkinter, so the app cannot open its window. Reinstall Python with the 1>&2
    echo          "tcl/tk and IDLE" option, delete the .venv folder and run install.bat again. 1>&2
)

rem --- 2. torch, pinned, CUDA or CPU build as fits this machine --------------------------------------------
echo ==^> Checking torch
"%VENV_PY%" scripts\install_torch.py --python "%VENV_PY%"
if errorlevel 1 (
    echo. 1>&2
    echo ERROR: installing torch failed, see above. Override with ONETRAINER_TORCH=cpu or cuda, or ONETRAINER_TORCH_INDEX=URL. 1>&2
    exit /b 1
)

rem --- 3. OneTrainer (editable) and its other dependencies -------------------------------------------------
if "%DEV%"=="1" (
    set "TARGET=.[dev]"
    echo ==^> Installing OneTrainer ^(editable^) with its dependencies and the dev tools ^(pytest, ruff^)
) else (
    set "TARGET=."
    echo ==^> Installing OneTrainer ^(editable^) with its dependencies
)
"%VENV_PY%" -m pip install -e "%TARGET%"
if errorlevel 1 (
    echo. 1>&2
    echo ERROR: pip install -e "%TARGET%" failed, see pip's error above. 1>&2
    exit /b 1
)

rem --- 4. what next ------------------------------------------------------------------------------------------
rem start-ui.bat runs this installer on first use and then starts the app itself (it sets ONETRAINER_STARTING_APP).
if "%ONETRAINER_STARTING_APP%"=="1" (
    echo ==^> Done. Starting the app...
) else (
    echo ==^> Done. Start the app: start-ui.bat
    if "%DEV%"=="1" echo     Run the tests: .venv\Scripts\python.exe -m pytest
)
exit /b 0

:try_python
rem %* is a command ("py -3.12", python, or a quoted path); PY is set to it when it runs Python 3.10 to 3.13
%* -c "%PYCHECK%" >nul 2>&1
if not errorlevel 1 set "PY=%*"
exit /b 0

:usage
echo Usage: install.bat [--dev]
echo   Installs OneTrainer into .venv; --dev adds the test tools (pytest, ruff).
echo   PYTHON=... picks the interpreter; ONETRAINER_TORCH=cpu/cuda and ONETRAINER_TORCH_INDEX=URL pick the torch build.
exit /b 0
