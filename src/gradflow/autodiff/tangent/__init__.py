"""Forward mode: the tangent program of an SDFG.

The tangent program computes what the program computes and, next to every value that depends on a `wrt`
input, its directional derivative (its tangent) along given input tangents. Unlike reverse mode it keeps
the program's structure: no tape, no reversed control flow. Every operation that writes a varied array
also writes that array's tangent at the same elements, in the same state, through a rule of the `tangent`
table (keyed like the reverse table by operation kind) or, for a library node kept whole, of the
`tangent_library` table (keyed by node class):

- a tasklet becomes a *dual* tasklet: its code, preceded by the tangent of each output it writes, the
  derivatives coming from the same symbolic reading of the code (and `rules/elementwise.toml`) that reverse
  mode uses (`dual.py`);
- a copy copies the tangent too; a nested SDFG is made its own tangent program; a library node gets the
  nodes of its tangent (a product rule of two products, a reduction of the tangent, ...).

Because each tangent is computed by the node that computes its value (or reads the same access nodes in
the same state), the tangent dataflow has the program's ordering, in-place updates included.
"""
