"""The first-hour commands, read from `make -n` (nothing is run): `make lab` as root and as a
user, the project kernel, and a set-up stamp that names the torch spec (issue 17 items 6-7)."""

import os
import re
import shutil
import subprocess

import pytest

from rpka.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_n(venv, *args):
    """The commands `make` would run, with the virtual environment at ``venv``."""
    # under `make test` this is a sub-make: drop the parent's flags, which add
    # "make[1]: Entering/Leaving directory" lines to the output
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    run = subprocess.run(
        ["make", "--no-print-directory", "-n", f"VENV={venv}", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout


def installed(venv):
    """A venv that `make setup` finished with the default torch spec (its stamp touched)."""
    stamp = re.search(r"^touch (\S+)$", make_n(venv, "setup"), re.M).group(1)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    open(stamp, "w").close()  # newer than pyproject.toml
    return venv


def test_setup_installs_the_named_project_kernel(tmp_path):
    commands = make_n(tmp_path / "venv", "setup")
    assert (
        '-m ipykernel install --sys-prefix --name rpka --display-name "Python (rpka)"' in commands
    )


def test_lab_opens_at_the_root_and_allows_root_only_as_root(tmp_path):
    command = make_n(installed(tmp_path / "venv"), "lab").strip().splitlines()[-1]
    assert f'--ServerApp.root_dir="{REPO_ROOT}"' in command
    assert ("--allow-root" in command) == (os.geteuid() == 0)


def test_setup_reinstalls_when_the_torch_spec_changes(tmp_path):
    venv = installed(tmp_path / "venv")
    assert "pip install" not in make_n(venv, "setup")  # up to date
    assert 'pip install --quiet --upgrade "torch"' in make_n(venv, "setup", "TORCH_SPEC=torch")


def test_conda_environment_pins_the_makefile_torch():
    spec = re.search(r"^TORCH_SPEC \?= (\S+)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    pins = re.findall(r"^\s+- (torch\S*)$", (REPO_ROOT / "environment.yml").read_text(), re.M)
    assert pins == [spec.group(1)] and "==" in pins[0]


def test_setup_silences_only_setuptools_editable_banner(tmp_path):
    """pip >= 25 passes the build backend's warnings through --quiet: setuptools' editable
    install banner ("Editable installation ... Please be careful with folders") was the
    only noise of a fresh set-up (issue 31 item 7). The filter names that message alone."""
    install = next(
        line for line in make_n(tmp_path / "venv", "setup").splitlines() if "-e " in line
    )
    assert install.startswith('PYTHONWARNINGS="ignore:Editable installation" ')
