"""A non-editable install works: the wheel carries the rule tables, the `gradflow` command and the
verification corpora. Built from this checkout, installed into a fresh virtual environment (its other
dependencies are borrowed from the test environment's site-packages), used from outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import numpy as np, dace, gradflow
    assert "site-packages" in gradflow.__file__ and "ROOT" not in gradflow.__file__, gradflow.__file__
    N = dace.symbol("N")

    @dace.program
    def f(X: dace.float64[N], S: dace.float64[1]):
        S[0] = np.sum(np.sin(X) * X)

    x = np.linspace(-1, 1, 5)
    value, g = gradflow.value_and_grad(f, wrt="X")(X=x, S=np.zeros(1))
    np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x), rtol=1e-12)
    print("gradient ok")
''').replace("ROOT", str(ROOT))


def test_wheel_installs_into_a_fresh_venv_and_differentiates(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(ROOT)], check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("gradflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gradflow/rules/elementwise.toml" in names and "gradflow/verify/corpus/loops.py" in names

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, text=True)

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "use_gradflow.py").write_text(SCRIPT)  # DaCe reads a program's source from its file
    run = subprocess.run([str(python), "use_gradflow.py"], cwd=work, capture_output=True, text=True)
    assert run.returncode == 0 and "gradient ok" in run.stdout, run.stderr[-3000:]
    check = subprocess.run([str(env / "bin" / "gradflow"), "verify", "--quick", "--table", "elementwise", "--rule",
                            "tanh", "--jobs", "1"], cwd=work, capture_output=True, text=True)
    assert check.returncode == 0 and "1 of 1 rules verified" in check.stdout, check.stdout + check.stderr[-3000:]
