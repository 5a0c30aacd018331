"""Saying so when synthesized trees fall short of the cut bound.

The cut bound (ForestColl) lets data take any path through the switches; the trees can only
use the logical edges, each loading its links as the routes of
:func:`commflow.topology.weighted_routes` do. Where those routes cannot realise the bound's
packing (e.g. traffic of one box kept off the network that the bound counts), the best trees
are slower than the bound: :func:`check_trees` warns with a :class:`BoundWarning` that names
the binding cut, instead of returning a slow program silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from commflow.synth.forest import binding_cut
from commflow.synth.links import LogicalEdges
from commflow.synth.trees import WeightedTree, tree_seconds

TOLERANCE = 0.02
"""How far (relative) above the cut bound the trees' busiest link may be without a warning."""


class BoundWarning(UserWarning):
    """Synthesized trees are slower than the cut bound by more than :data:`TOLERANCE`."""


def check_trees(what: str, edges: LogicalEdges, trees: Sequence[WeightedTree],
                roots: list[int] | None) -> float:
    """The fraction of the cut bound ``trees`` reach on ``edges`` (1.0 at the bound); warns
    with a :class:`BoundWarning` naming the binding cut when it is below ``1 - TOLERANCE``.
    ``what`` names the collective and topology in the message."""
    loads = tree_seconds(edges, tuple(trees))
    if loads is None or not len(trees):
        return 1.0
    ranks = list(range(edges.nranks)) if roots is None else roots
    _, cut = binding_cut(edges, ranks)
    bound = cut.weight / float(cut.bandwidth)
    reached = bound / float(loads.max()) if loads.max() > 0 else 1.0
    if reached < 1 - TOLERANCE:
        nodes = edges.topology.nodes
        names = ", ".join(nodes[i].name for i in cut.nodes)
        direction = "entering" if edges.reverse else "leaving"
        warnings.warn(BoundWarning(
            f"{what}: the trees reach {reached:.1%} of the cut bound; binding cut "
            f"{{{names}}}: {cut.weight} share(s) over {float(cut.bandwidth) / 1e9:.4g} GB/s "
            f"{direction} it. The routes between ranks (commflow.topology.weighted_routes) "
            "cannot spread data over that cut's links as the bound does; add links or expect "
            "this fraction of the bound"), stacklevel=3)
    return reached
