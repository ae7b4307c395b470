"""Finding the CUDA compiler: the environment first, then the PATH, then the `nvidia-cuda-nvcc` wheel; a
typed error saying how to get one when there is none."""

from __future__ import annotations

import pytest

from gradflow.gpu import toolkit
from gradflow.gpu.toolkit import CudaToolkitError, find_toolkit


def _nothing_found(monkeypatch) -> None:
    for variable in ("GRADFLOW_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(toolkit, "_wheel_nvcc", lambda: None)


def test_no_compiler_anywhere_says_how_to_install_one(monkeypatch) -> None:
    _nothing_found(monkeypatch)
    with pytest.raises(CudaToolkitError) as info:
        find_toolkit()
    assert "gradflow[cuda]" in info.value.hint
    assert "CUDA_HOME" in str(info.value)


def test_a_variable_naming_a_folder_without_nvcc_is_an_error_naming_it(monkeypatch, tmp_path) -> None:
    _nothing_found(monkeypatch)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(CudaToolkitError, match=r"CUDA_HOME=.* has no bin/nvcc"):
        find_toolkit()


def test_the_environment_comes_before_the_path(monkeypatch, tmp_path) -> None:
    found = find_toolkit()  # the test extra installs the compiler (`gradflow[cuda]`)
    root = tmp_path / "toolkit"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").symlink_to(found.nvcc)
    monkeypatch.setenv("GRADFLOW_CUDA_HOME", str(root))
    chosen = find_toolkit()
    assert chosen.origin == "GRADFLOW_CUDA_HOME" and chosen.nvcc == root / "bin" / "nvcc"
    assert chosen.version == found.version != "unknown"


def test_the_wheel_is_found_without_a_path_or_environment(monkeypatch) -> None:
    wheel = toolkit._wheel_nvcc()
    if wheel is None:
        pytest.skip("the nvidia-cuda-nvcc wheel is not installed here (a system toolkit is used instead)")
    _nothing_found(monkeypatch)
    monkeypatch.setattr(toolkit, "_wheel_nvcc", lambda: wheel)
    chosen = find_toolkit()
    assert chosen.origin == "wheel" and chosen.version != "unknown"
