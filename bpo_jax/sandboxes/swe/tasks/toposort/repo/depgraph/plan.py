"""Build plans from target dependencies."""
from depgraph.sort import toposort


def build_order(targets, only=None):
    order = toposort(targets)
    if only is None:
        return order
    needed, stack = set(), [only]
    while stack:
        t = stack.pop()
        if t not in needed:
            needed.add(t)
            stack.extend(targets.get(t, ()))
    return [t for t in order if t in needed]
