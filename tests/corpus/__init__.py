"""Test corpora beyond the verification corpora shipped with gradflow (`gradflow.verify.corpus`: the
dataflow, loop and library-node programs with torch references):

- `purity.purity_corpus()`: diverse SDFGs for checking that passes never mutate their input;
- `constructs`: which SDFG constructs a corpus exercises (used by the structure tests).
"""
