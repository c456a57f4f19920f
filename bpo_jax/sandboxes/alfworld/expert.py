"""ALFWorld's hand-coded expert, played on the engine: the check that a generated game is
solvable, and the source of its walkthrough."""

from __future__ import annotations

import contextlib
import os
import random

from bpo_jax.sandboxes.alfworld.engine import _alfworld, _install_engine_caches
from bpo_jax.sandboxes.alfworld.games import GAME_FILE


@contextlib.contextmanager
def _seeded_global_random(seed: int):
  # ALFWorld's hand-coded expert draws from the global `random`; seed it for reproducible
  # walkthroughs, and put the caller's generator state back afterwards.
  state = random.getstate()
  random.seed(seed)
  try:
    yield
  finally:
    random.setstate(state)


def expert_walkthrough(game_dir: str, max_steps: int = 150, seed: int = 0) -> list[str] | None:
  """Plays a game directory with ALFWorld's hand-coded expert on the engine.

  Returns the commands that reached the goal, or None if the expert failed or timed out.
  """
  aw = _alfworld()
  _install_engine_caches()
  tw_env = aw["alfred_tw_env"]
  infos = aw["textworld"].EnvInfos(admissible_commands=True, won=True,
                                   extras=["gamefile", "expert_plan"])
  env = tw_env.AlfredExpert(tw_env.AlfredInfos(tw_env.AlfredDemangler(aw["PddlEnv"](infos))),
                            expert_type=tw_env.AlfredExpertType.HANDCODED)
  commands = []
  with _seeded_global_random(seed):
    try:
      # A game the engine cannot load is a bug, not an unsolved game: that raises.
      env.load(os.path.join(game_dir, GAME_FILE))
      state = env.reset()
      done = False
      while not done and len(commands) < max_steps:
        command = state["extra.expert_plan"][0]
        try:
          state, _, done = env.step(command)
        except Exception as e:  # pylint: disable=broad-except
          # The expert gives up by raising: HandCodedAgentFailed (a NameError), or ALFWorld's
          # wrapper turns its timeout into Exception("Timeout"). Then the game is unsolved.
          if isinstance(e, NameError) or e.args == ("Timeout",):
            return None
          raise
        commands.append(command)
    finally:
      env.close()
  return commands if state["won"] else None
