"""Checkpoint planning, a step before reversal: which loops a whole program checkpoints, and with how
many snapshots, when the user gave a byte budget; then those loops are outlined into steps
(`checkpoint.outline`), so that the engine finds them as single operations under `CheckpointedLoop`."""

from __future__ import annotations

import copy

import attrs
import dace

from gradflow.analysis.loops import describe_loop
from gradflow.autodiff import budget, checkpoint
from gradflow.autodiff.engine import survey
from gradflow.autodiff.forwarding import Forwarding
from gradflow.autodiff.spec import ADSpec, ADTables, Differentiate
from gradflow.core.errors import NotDifferentiableError

#: the most snapshots a budget gives a loop checkpointed online (its trip count is known only once it has
#: run): its slots are allocated before it runs, however few trips it takes, and past this many they save
#: few reruns (`revolve.online_schedule`: the stride between stored states grows with the trips over the slots)
ONLINE_SNAPSHOTS = 1024


def plan_checkpoints(sdfg: dace.SDFG, spec: ADSpec, tables: ADTables, differentiate: Differentiate) -> ADSpec:
    """`spec` with the policy a budget becomes (`checkpoint_under_budget`), and the loops its policy
    checkpoints outlined in `sdfg` (in place: the caller owns it). Only for a whole program: a nested
    SDFG's policy never checkpoints."""
    policy = spec.forwarding
    if not spec.outermost:
        return spec
    if policy.max_bytes is not None and policy.snapshots is None and policy.budget_checkpoints:
        spec = attrs.evolve(spec, forwarding=checkpoint_under_budget(sdfg, spec, tables, differentiate))
    if spec.forwarding.snapshots is not None:
        checkpoint.outline(sdfg, spec.forwarding.checkpoint_loops)
    return spec


def checkpoint_under_budget(sdfg: dace.SDFG, spec: ADSpec, tables: ADTables,
                            differentiate: Differentiate) -> Forwarding:
    """The policy a byte budget becomes: itself when a store/recompute plan fits, else the budget with the
    outermost counted loops and unbounded while loops checkpointed (`Forwarding.checkpoint`) with as many
    snapshots as the bytes left by the rest of the plan allow (more snapshots, fewer reruns); a budget
    neither fits is a `BudgetError` stating the lesser least.

    Checkpointing only when nothing else fits: priced against the store/recompute plan by rerun work alone,
    it was chosen where that plan fitted and ran slower (lp_lu at half of STORE_ALL's bytes, 1.8x
    RECOMPUTE_ALL's time: the snapshot copies, a whole matrix per takeshot and restore, went unpriced)."""
    policy = spec.forwarding
    sizes = dict(policy.sizes)
    loops = sorted(checkpoint.budget_candidates(sdfg, policy.bound_of), key=lambda loop: loop.label)
    labels = tuple(loop.label for loop in loops)
    if not labels:
        return policy
    named = ", ".join(describe_loop(loop) for loop in loops)  # in the author's terms, for the errors
    max_bytes = policy.max_bytes
    assert max_bytes is not None  # `plan_checkpoints` calls this only for a policy with a byte budget
    plain_minimum = None
    try:
        survey(copy.deepcopy(sdfg), spec, tables, differentiate).choose(max_bytes)
        return policy  # a store/recompute plan fits
    except budget.BudgetError as err:
        plain_minimum = err.minimum
    except NotDifferentiableError:  # e.g. a while loop without a bound, which the plain plan cannot price
        pass

    outlined = copy.deepcopy(sdfg)
    trial = attrs.evolve(spec, forwarding=attrs.evolve(policy, snapshots=1, checkpoint_loops=labels))
    try:
        checkpoint.outline(outlined, labels)
        front = survey(outlined, trial, tables, differentiate)
        items = [item for item in front.regions if checkpoint.is_outlined(item)]
        per_slot = sum(checkpoint.slot_bytes(item, front.rev, sizes) for item in items)
    except NotDifferentiableError as err:
        if plain_minimum is None:
            raise
        # the loops cannot be checkpointed (their bodies, outlined, are not differentiable as steps): the
        # store/recompute plan's least is the least of any plan
        reason = err.message.splitlines()[0]
        raise budget.BudgetError(f"no store/recompute plan keeps at most {max_bytes} bytes for the "
                                 f"backward sweep, and {named} cannot be checkpointed "
                                 f"({reason}); the least any plan needs is {plain_minimum} bytes",
                                 f"raise the budget to at least {plain_minimum}", plain_minimum) from None
    def slots(snapshots: int) -> int:  # what the checkpointed loops keep (`checkpoint.snapshot_bytes`)
        return sum(checkpoint.snapshot_bytes(item, front.rev, sizes, snapshots) for item in items)

    try:
        rest = front.choose(max_bytes - slots(1))
    except budget.BudgetError as err:
        least = err.minimum + slots(1)
        least = least if plain_minimum is None else min(least, plain_minimum)
        raise budget.BudgetError(f"no plan keeps at most {max_bytes} bytes for the backward sweep, with "
                                 f"{named} checkpointed or not; the least any plan needs is {least} bytes",
                                 f"raise the budget to at least {least}", least) from None
    # s snapshots keep at most `fixed` + s * per_slot bytes (a counted loop's slot for its last step's
    # start, an online loop's trip record); more snapshots than trips are of no use, and a loop checkpointed
    # online, whose trip count is known only once it has run, takes what the budget leaves up to a cap
    fixed = slots(1) - per_slot
    if any(checkpoint.online(item, front.rev) for item in items):
        most = ONLINE_SNAPSHOTS
    else:
        most = max((checkpoint.trip_count(item, sizes) for item in items), default=1)
    snapshots = max(1, min(most, (max_bytes - rest.predicted_bytes - fixed) // per_slot)) if per_slot else 1
    return attrs.evolve(policy, snapshots=snapshots, checkpoint_loops=labels)
