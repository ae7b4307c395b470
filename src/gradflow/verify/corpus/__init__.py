"""Programs with independent references, shipped so that `gradflow verify` can check every rule.

- `dataflow.CASES`: loop-free programs (maps, tasklets, slices, overwrites, library nodes);
- `loops.CASES`: PolyBench/NPBench-style loop kernels (LoopRegions, ConditionalBlocks, while loops);
- `library.CASES`: one program per library-node rule, each checked two routes (op-level rule vs expansion).

Every case pairs a `@dace.program` with a PyTorch reference of the same scalar (`case.py`).
"""
