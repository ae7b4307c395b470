"""`gradflow fuzz`: a differential program fuzzer. A grammar (`grammar.py`, hypothesis strategies) writes
programs (`program.py`) that render both as a `@dace.program` and as a plain numpy twin; each is checked
(`check.py`) against the twin (values) and the twin's central differences (gradients) under gradflow's
routes, forwarding policies and optimization; campaigns (`campaign.py`) run programs in worker processes
(`worker.py`), shrink failures (`shrink.py`) and report verdicts by class. See docs/verification.md.
"""

from gradflow.verify.fuzz.campaign import draw, record, report, run
from gradflow.verify.fuzz.check import CONFIGS, DEFAULT, Verdict, check_program, spec_of
from gradflow.verify.fuzz.grammar import FEATURES, programs
from gradflow.verify.fuzz.program import Program
from gradflow.verify.fuzz.shrink import shrink

__all__ = ["CONFIGS", "DEFAULT", "FEATURES", "Program", "Verdict", "check_program", "draw", "programs", "record", "report",
           "run", "shrink", "spec_of"]
