"""An estimator-level testbed: tabular policies in snapshot worlds, where seeds cost nothing.

  worlds.py    the chain worlds (a pure step function over a small state: the snapshot is the
               state) and their exact figures by enumeration: success J(θ), the prefix's share
  grow.py      one task's tree (BPO's online fork rule and budget) or group, jitted
  learn.py     the library's estimators on those trees, plain gradient steps, vmapped over seeds;
               the gradient's draws at fixed parameters
  analysis.py  intervals over seeds, updates to reach a level, variance ratios
  sandbox.py   a world behind the library's Sandbox protocol (text actions, byte snapshots)

docs/DESIGN.md §8 gives the rules; experiments/testbed.py runs it.
"""
