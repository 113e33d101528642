"""Installing the project prints no warnings (setuptools deprecations, editable-mode notes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pip_install_editable_prints_no_build_warnings(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # As `make install` does: a recent pip shows the build backend's warnings, an old one hides
    # them.
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--upgrade", "pip"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Only the build's own output counts (a machine's pip configuration may warn about its
    # index locations, which says nothing about this project).
    build_output = [
        line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location")
    ]
    assert not [
        line for line in build_output if "Warning" in line or "deprecated" in line.lower()
    ], "\n".join(build_output)
