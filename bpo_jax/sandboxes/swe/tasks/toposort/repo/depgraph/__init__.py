from depgraph.sort import CycleError, toposort
from depgraph.plan import build_order
