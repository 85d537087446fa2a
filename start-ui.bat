@echo off
rem Open the OneTrainer app (Windows). Installs it into .venv first when needed (install.bat).
rem Arguments are passed to scripts\train_ui.py.
setlocal EnableExtensions DisableDelayedExpansion
cd /d "%~dp0"
set "VENV_PY=%CD%\.venv\Scripts\python.exe"

if not exist "%VENV_PY%" goto :install
"%VENV_PY%" -c "import onetrainer, customtkinter" >nul 2>&1
if errorlevel 1 goto :install
goto :run

:install
echo ==^> OneTrainer is not installed yet (or incompletely): running install.bat
set "ONETRAINER_STARTING_APP=1"
call "%~dp0install.bat"
if errorlevel 1 (
    echo ERROR: the installation failed, see above. 1>&2
    pause
    exit /b 1
)
"%VENV_PY%" -c "import onetrainer, customtkinter"
if errorlevel 1 (
    echo. 1>&2
    echo ERROR: the app still does not import after installing, see the error above. If it is about tkinter, 1>&2
    echo        reinstall Python with the "tcl/tk and IDLE" option, delete .venv and run start-ui.bat again. 1>&2
    pause
    exit /b 1
)

:run
"%VENV_PY%" scripts\train_ui.py %*
if errorlevel 1 (
    echo. 1>&2
    echo The app exited with an error, see above. 1>&2
    pause
    exit /b 1
)
exit /b 0
