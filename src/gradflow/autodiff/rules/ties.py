"""How a max or min passes its gradient on: split equally among the ties, as `torch.amax` does.

Every candidate equal to the result `__r` gets `__g / __c` of the result's gradient `__g`, where `__c`
counts the candidates equal to it. One home for the formulas the rules of both kinds of extremum emit as
tasklet code (`extremum.py`: maps with a max/min write-conflict resolution; `library/reduce.py`: `Reduce`
nodes), which name the candidate's value `value`.
"""

from __future__ import annotations


def tie(value: str) -> str:
    """1 where the candidate `value` equals the result `__r`, else 0 (what `__c` sums)."""
    return f"({value} == __r)"


def share(value: str) -> str:
    """The candidate's part of the result's gradient: `__g` split over the `__c` ties."""
    return f"{tie(value)} * __g / __c"
