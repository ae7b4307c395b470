"""Fault injection on the compile cache: damaged entries are rebuilt (with a warning), never loaded; an
unusable cache root falls back to a private cache (one warning); a build killed half-way publishes
nothing and the next build succeeds.

Each test works in its own cache root (`GRADFLOW_CACHE`); the in-process memo is keyed by entry folder,
so a new root means a real load from disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import gradflow
from gradflow.core.errors import CacheWarning
from gradflow.runtime.calling import Runner
from gradflow.runtime.compile import compile_sdfg
from tests.reliability import programs

REPO = Path(__file__).resolve().parents[2]
SRC = Path(gradflow.__file__).resolve().parents[1]
FACTOR = 3.0


def _entries(root: Path) -> list[Path]:
    """Published entries: folders whose name is a key (staging folders start with a dot)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _library(entry: Path) -> Path:
    return next(p for p in (entry / "build").glob("lib*.so") if not p.name.startswith("libdacestub_"))


def _runs_correctly(compiled, factor: float = FACTOR) -> None:
    X, Y = np.arange(1.0, 6.0), np.zeros(5)
    Runner(compiled)(X=X, Y=Y)
    np.testing.assert_array_equal(Y, factor * X)


def _verifies(entry: Path) -> bool:
    record = json.loads((entry / "BUILT").read_text())
    return all(hashlib.sha256((entry / rel).read_bytes()).hexdigest() == digest
               for rel, digest in record["files"].items())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A cache root holding one good entry of `scaled_copy`."""
    root = tmp_path_factory.mktemp("pristine")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADFLOW_CACHE", str(root))
        compile_sdfg(programs.scaled_copy("cache_faults", FACTOR))
    return root


def _truncate(lib: Path) -> None:
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 3])


def _empty(lib: Path) -> None:
    lib.write_bytes(b"")


def _delete(lib: Path) -> None:
    lib.unlink()


def _overwrite(lib: Path) -> None:
    lib.write_bytes(np.random.default_rng(0).bytes(lib.stat().st_size))


def _bad_marker(lib: Path) -> None:
    (lib.parents[1] / "BUILT").write_text("{not json")


@pytest.mark.parametrize("damage", [_truncate, _empty, _delete, _overwrite, _bad_marker],
                         ids=["truncated", "empty", "deleted", "overwritten", "bad-marker"])
def test_damaged_entry_is_rebuilt_with_a_warning(pristine, tmp_path, monkeypatch, damage):
    root = tmp_path / "cache"
    shutil.copytree(pristine, root)
    (entry,) = _entries(root)
    damage(_library(entry))
    monkeypatch.setenv("GRADFLOW_CACHE", str(root))
    with pytest.warns(CacheWarning, match="rebuilding"):
        compiled = compile_sdfg(programs.scaled_copy("cache_faults", FACTOR))
    _runs_correctly(compiled)
    assert _entries(root) == [entry] and _verifies(entry)
    assert not [p for p in root.iterdir() if p.name.startswith((".build-", ".stale-"))]


@contextlib.contextmanager
def _unprivileged():
    """The superuser ignores permission bits; take a plain user's effective uid for the block."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _read_only(root: Path) -> None:
    root.mkdir()
    root.chmod(0o555)


def _a_file(root: Path) -> None:
    root.write_text("not a folder")


@pytest.fixture
def open_folder():
    """A folder anyone may enter (pytest's tmp_path is private to its owner)."""
    folder = Path(tempfile.mkdtemp(prefix="gradflow-test-"))
    folder.chmod(0o755)
    yield folder
    for p in (folder, *folder.rglob("*")):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(folder)


@pytest.mark.parametrize("make", [_read_only, _a_file], ids=["read-only", "a-file"])
def test_unusable_cache_root_falls_back_to_a_private_cache_with_one_warning(open_folder, monkeypatch, make):
    root = open_folder / "cache"
    make(root)
    monkeypatch.setenv("GRADFLOW_CACHE", str(root))
    with _unprivileged(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = compile_sdfg(programs.scaled_copy("fallback_a", 5.0))
        second = compile_sdfg(programs.scaled_copy("fallback_b", 7.0))
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and str(root) in str(ours[0].message)
    _runs_correctly(first, 5.0)
    _runs_correctly(second, 7.0)
    assert root.is_file() or not any(root.iterdir())


KILLED_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from gradflow.runtime.compile import compile_sdfg
from tests.reliability import programs
compile_sdfg(programs.scaled_copy("killed_build", float(sys.argv[2])))
"""


def _compiler_running(root: Path) -> bool:
    """A build of the child has reached CMake (some folder of the root has a configured build folder)."""
    return root.is_dir() and any((p / "build" / "CMakeFiles").is_dir() for p in root.iterdir() if p.is_dir())


def test_build_killed_midway_publishes_nothing_and_the_next_build_succeeds(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    env = {**os.environ, "GRADFLOW_CACHE": str(root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)])}
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(REPO), "11.0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not _compiler_running(root):
        assert child.poll() is None, f"the child ended before it could be killed: {child.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "the child never started compiling"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stderr.close()
    assert _entries(root) == []  # nothing half-built is published under a key

    monkeypatch.setenv("GRADFLOW_CACHE", str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # no entry was published: a plain miss, no warning
        compiled = compile_sdfg(programs.scaled_copy("killed_build", 11.0))
    _runs_correctly(compiled, 11.0)
    (entry,) = _entries(root)
    assert _verifies(entry)
    assert not [p for p in root.iterdir() if p.name.startswith(".build-")]  # the killed build's folder is gone
