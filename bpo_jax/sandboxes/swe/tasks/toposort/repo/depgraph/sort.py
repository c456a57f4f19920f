"""Topological sorting of a dependency mapping {node: [dependencies]}."""


class CycleError(ValueError):
    pass


def toposort(graph):
    """Nodes in an order where every node comes after its dependencies (ties by name)."""
    nodes = set(graph)
    for deps in graph.values():
        nodes.update(deps)
    pending = {n: set(graph.get(n, ())) for n in nodes}
    order = []
    while True:
        ready = sorted(n for n, deps in pending.items() if not deps)
        if not ready:
            break
        for n in ready:
            order.append(n)
            del pending[n]
        for deps in pending.values():
            deps.difference_update(ready)
    return order
