"""Fresh processes share one cache entry: the same gradient hashes the same in every process, whatever
its hash seed, and concurrent processes build it once.

Four interpreters (PYTHONHASHSEED 0..3) start together on an empty cache and each runs
`gradflow.grad` and `gradflow.value_and_grad` of the logistic-regression loss. One of them builds (the
others wait on the entry's lock and load it); every one reports the same fingerprint, the same value and
bitwise the same gradients, and the cache holds one entry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gradflow

REPO = Path(__file__).resolve().parents[2]
SRC = Path(gradflow.__file__).resolve().parents[1]

CHILD = r"""
import json, logging, sys, time
sys.path.insert(0, sys.argv[1])
messages = []
class Collect(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
log = logging.getLogger("gradflow.runtime.compile")
log.addHandler(Collect())
log.setLevel(logging.INFO)
import gradflow
from gradflow.core.graph import fingerprint
from tests.reliability import programs
sdfg = gradflow.grad(programs.logistic, wrt=["w", "b"], of="loss")
f = gradflow.value_and_grad(programs.logistic, wrt=["w", "b"], of="loss")
start = time.perf_counter()
value, grads = f(**programs.logistic_inputs())
print(json.dumps({"fingerprint": fingerprint(sdfg), "built": sum(m.startswith("built") for m in messages),
                  "first_call_s": time.perf_counter() - start, "value": value,
                  "grads": {k: v.tolist() for k, v in grads.items()}}))
"""


def test_four_fresh_processes_share_one_build(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "GRADFLOW_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)])}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(REPO)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env={**env, "PYTHONHASHSEED": str(seed)})
                for seed in range(4)]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))

    assert len({r["fingerprint"] for r in reports}) == 1
    assert sum(r["built"] for r in reports) == 1
    entries = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert len(entries) == 1 and (cache / entries[0] / "BUILT").is_file(), entries
    assert all(r["value"] == reports[0]["value"] and r["grads"] == reports[0]["grads"] for r in reports)


#: Programs whose loops `LoopToMap` turns into maps: DaCe numbers the new maps' connectors in the order it
#: iterates a set of names, which follows the hash seed (the fingerprint must not).
SEEDED = ("lp_softmax", "lp_triangular", "lp_masked_normalise")

FINGERPRINTS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from gradflow.api import grad_graph
from gradflow.optimize import optimized
from gradflow.verify.corpus import loops
cases = {c.name: c for c in loops.CASES}
print(json.dumps({n: [grad_graph(cases[n].program, wrt=list(cases[n].wrt), of=cases[n].of).fingerprint,
                      optimized(cases[n].program).fingerprint] for n in sys.argv[2:]}))
"""


def test_gradients_of_loops_made_maps_hash_alike_under_any_hash_seed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)])}
    children = [subprocess.Popen([sys.executable, "-c", FINGERPRINTS, str(REPO), *SEEDED], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env={**env, "PYTHONHASHSEED": str(seed)})
                for seed in (1, 2)]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert set(reports[0]) == set(SEEDED)
    assert reports[0] == reports[1]
