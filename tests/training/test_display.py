"""The drawn tree: grown as training grows it from a checkpoint, at the stored threshold, with a
fork whose siblings differ and the advantages the estimator gives it; drawn with its root
observation wrapped at word boundaries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bpo_jax import estimators
from bpo_jax.training import display
from bpo_jax.training import loop
from bpo_jax.training.settings import from_config
from experiments.configs import base
from tests.training import mesh_setup


def small_config(checkpoint: str):
  """The notebook's BPO configuration at its tiny size, with five turns (the world's), from the
  mesh test's warm-started checkpoint (`small_checkpoint`, whose branches sometimes succeed and
  sometimes fail), its warm start continued for a few steps (`mesh_setup.from_checkpoint`)."""
  config = base.tiny(base.compared(base.rooms("bpo")))
  config.rollout.tasks_per_iteration = 4
  config.env.max_turns = 5
  config.rollout.max_env_steps = config.rollout.k * config.env.max_turns
  config.scale.num_devices = 1  # not this process's eight
  return mesh_setup.from_checkpoint(config, checkpoint)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory, small_checkpoint):
  config = small_config(small_checkpoint)
  workdir = str(tmp_path_factory.mktemp("display") / "bpo")
  loop.train(config, workdir, stop_after=0)  # the warm start and checkpoint 0
  # The fork threshold comes from the checkpoint, not from the configuration it is given
  # (one that would fork nowhere here).
  drawing = config.copy_and_resolve_references()
  drawing.rollout.entropy_threshold = 100.0
  return config, display.draw_tree(from_config(drawing), workdir, step=0)


@pytest.mark.slow
def test_the_drawn_tree_forks_where_siblings_differ_with_the_estimators_advantages(drawn):
  config, tree = drawn
  assert tree.iteration == 1 and tree.threshold == config.rollout.entropy_threshold == 0.0
  assert tree.draw == 0  # training's own key of iteration 1 grew it
  assert tree.differing_forks
  rollout = tree.rollout
  values = np.asarray(estimators.node_values(jax.tree.map(jnp.asarray, rollout.tree),
                                             float(config.rollout.gamma)))
  kids = rollout.tokens.children()
  for fork in tree.differing_forks:
    children = kids[fork]
    assert len(children) >= 2 and np.ptp(values[children]) > 0
    # BPO at a fork: A_i = Q̂(i) − the mean of its siblings' Q̂ (leave-one-out).
    for i in children:
      others = [values[j] for j in children if j != i]
      np.testing.assert_allclose(tree.advantages[i], values[i] - np.mean(others),
                                 rtol=0, atol=1e-6)
    assert np.abs(tree.advantages[children]).max() > 0


@pytest.mark.slow
def test_the_drawing_wraps_the_root_at_words_and_marks_the_forks(drawn):
  _, tree = drawn
  text = display.render_tree(tree.rollout, tree.advantages, tuple(tree.differing_forks))
  lines = text.splitlines()
  first_step = next(i for i, line in enumerate(lines) if line.startswith(("├─ ", "└─ ")))
  root = [lines[0][len("[root] "):]] + [line.strip() for line in lines[1:first_step]]
  marked_root = "  ◆" if tree.rollout.num_nodes in tree.differing_forks else ""
  assert " ".join(root) == " ".join(tree.rollout.first_observation.split()) + marked_root
  assert all(len(line.removesuffix(marked_root)) <= display.ROOT_WIDTH for line in root)
  assert text.count("◆") == len(tree.differing_forks)
  steps = [line for line in lines if " r=" in line]
  assert len(steps) == int(tree.rollout.tokens.alive().sum())  # one line per step
  assert all(" A=" in line for line in steps)
