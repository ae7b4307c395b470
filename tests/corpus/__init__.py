"""Test corpora for gradflow: DaCe programs paired with PyTorch reference implementations.

- `dataflow.CASES`: loop-free programs (maps, tasklets, slices, overwrites, library nodes).
- `loops.CASES`: PolyBench/NPBench-style loop kernels (LoopRegions, ConditionalBlocks, while loops).
- `purity.purity_corpus()`: diverse SDFGs for checking that passes never mutate their input.

Every case is a `Case` (see `case.py`); `case.py` also holds helpers to run a case in DaCe and in torch.
"""
