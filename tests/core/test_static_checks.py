"""The linter and the type checker pass on the layers the engine is built from (`core`, `analysis`,
`autodiff`, `transforms`; their configuration is in pyproject.toml), so the suite, and with it CI, fails
on a new finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ["src/gradflow/core", "src/gradflow/analysis", "src/gradflow/autodiff", "src/gradflow/transforms"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    done = _run("ruff", "check", "--no-cache", *CHECKED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    done = _run("mypy")  # its files are listed in pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_function_is_over_100_lines():
    """A long function hides its steps; every function of `src/gradflow` stays within 100 lines."""
    import ast

    long = []
    for path in sorted((ROOT / "src" / "gradflow").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 100 lines:\n  " + "\n  ".join(long)
