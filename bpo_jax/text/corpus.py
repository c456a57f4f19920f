"""The text a from-scratch tokenizer learns from: an environment's episodes as chat turns.

For each distinct task (the first `max_tasks`), the expert's episode is played from reset and
written as the conversation the policy will see (`bpe.chatml_text`): the system prompt, the
first observation as a user turn, then each action as an assistant turn and the observation it
produced as a user turn. The actions admissible along the way (where the sandbox lists them) are
added as texts of their own, so that actions the expert did not take are in the corpus too. An
environment without an expert (the gym worlds) is walked instead, taking its admissible actions
in turn.

The texts are a pure function of the tasks and options (sandboxes are deterministic), so the
tokenizer trained on them is too.

An environment may also name the strings of its text that a policy has to copy whole (a shop's
product ids): a module-level `atomic_strings(**options) -> Sequence[str]`, read by
`atomic_strings` here, whose strings the tokenizer keeps as one token each (`bpe.py`). They are
names fixed by the environment's options, the same for every split (a shop's catalogue, not its
goals).

    texts = environment_texts("rooms", rooms.make_tasks("train", 64, seed=0))
    names = atomic_strings("webshop", {"num_products": 200})   # the 200 product ids
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from bpo_jax.sandboxes import registry
from bpo_jax.text import bpe

DEFAULT_MAX_TASKS = 64


def _distinct(tasks: Sequence[Any], limit: int) -> list[Any]:
  seen, out = set(), []
  for task in tasks:
    key = getattr(task, "task_id", None)
    key = key if key is not None else repr(task)
    if key not in seen:
      seen.add(key)
      out.append(task)
    if len(out) == limit:
      break
  return out


def _admissible(sandbox) -> list[str]:
  return list(sandbox.admissible_actions()) if hasattr(sandbox, "admissible_actions") else []


def play_episode(sandbox, task: Any, max_steps: int) -> tuple[str, list[str], list[str],
                                                              list[str]]:
  """(first observation, actions, observations, admissible actions seen) of the expert's
  episode of `task`, or of a walk over the admissible actions when there is no expert."""
  first = sandbox.reset(task)
  expert = sandbox.expert_actions() if hasattr(sandbox, "expert_actions") else None
  actions, observations, admissible = [], [], []
  for t in range(max_steps):
    choices = _admissible(sandbox)
    admissible.extend(choices)
    if expert:
      if t == len(expert):
        break
      action = expert[t]
    elif choices:
      action = choices[t % len(choices)]
    else:
      break
    step = sandbox.step(action)
    actions.append(action)
    observations.append(step.observation)
    if step.done:
      break
  return first, actions, observations, admissible


def episode_messages(system_prompt: str | None, first_observation: str, actions: Sequence[str],
                     observations: Sequence[str]) -> list[dict[str, str]]:
  """An episode as chat messages: observations are user turns, actions assistant turns."""
  messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
  messages.append({"role": "user", "content": first_observation})
  for action, observation in zip(actions, observations):
    messages += [{"role": "assistant", "content": action},
                 {"role": "user", "content": observation}]
  return messages


def environment_texts(env_name: str, tasks: Sequence[Any],
                      env_options: Mapping[str, Any] | None = None,
                      system_prompt: str | None = None, max_tasks: int = DEFAULT_MAX_TASKS,
                      max_steps: int = 32) -> list[str]:
  """The training texts of a from-scratch tokenizer for `env_name` (see the module docstring).

  Args:
    env_name: a registered environment.
    tasks: tasks of that environment (typically the training split); repeats are played once.
    env_options: keyword arguments of the environment's `make_sandbox`.
    system_prompt: the system turn; None: the environment's `SYSTEM_PROMPT`.
    max_tasks: most distinct tasks played.
    max_steps: most steps per episode.
  """
  if system_prompt is None:
    system_prompt = registry.get_action_syntax(env_name).system_prompt
  env = registry.get_environment(env_name)
  sandbox = env.make_sandbox(**dict(env_options or {}))
  texts = []
  try:
    for task in _distinct(tasks, max_tasks):
      first, actions, observations, admissible = play_episode(sandbox, task, max_steps)
      texts.append(bpe.chatml_text(episode_messages(system_prompt, first, actions, observations)))
      texts.extend(sorted(set(admissible)))
  finally:
    sandbox.close()
  return texts


def atomic_strings(env_name: str, env_options: Mapping[str, Any] | None = None) -> list[str]:
  """The strings environment `env_name` names to be kept whole by a from-scratch tokenizer: its
  module's `atomic_strings(**options)`, in its order; [] for an environment without one."""
  hook = getattr(registry.get_environment(env_name), "atomic_strings", None)
  if hook is None:
    return []
  names = list(hook(**dict(env_options or {})))
  bad = next((n for n in names if not isinstance(n, str)), None)
  if bad is not None:
    raise TypeError(f"{env_name}.atomic_strings must return str, got {type(bad).__name__}")
  return names
