"""The package type-checks (mypy settings in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path


def test_mypy_passes() -> None:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
