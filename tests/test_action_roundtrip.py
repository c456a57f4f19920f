"""Expert episodes played through the text path reach the rewards they reach played directly.

For each environment the run's tokenizer is built as a from-scratch run builds it (`build_text`:
a byte-level BPE trained on the training tasks' expert episodes, saved and reloaded in Hugging
Face format). Every expert action then goes the way a generated action goes: its tokens
(`fmt.action_tokens`, ending with the end-of-turn token) are what the policy would sample, a
few more tokens after the stop stand for a sampler that ran on, `fmt.decode_action` cuts them
at the stop token and decodes the reply, and the environment's parser takes the action out of
the reply (`FreeTextSandbox`). The episode played from those replies must give, step by step,
the observations, rewards and outcome of the episode played from the expert's own actions:
every episode, in every environment.
"""

import os

import pytest

from bpo_jax.sandboxes import free_text, registry
from bpo_jax.text import build
from bpo_jax.text import chat

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
WEBSHOP = {"num_products": 1000, "catalogue_seed": 0, "goals_per_product": 2, "max_steps": 10}
TEXTWORLD = {"games_dir": os.path.join(FIXTURES, "textworld_games")}


def _swe_tasks():
  from bpo_jax.sandboxes import swe  # pylint: disable=g-import-not-at-top
  return [swe.load_shipped_task(name) for name in swe.shipped_task_names()]


_TASKS = {}


def _tasks(env_name, options, split, num, seed):
  """The environment's tasks, made once per test process (ALFWorld generates its games)."""
  key = (env_name, tuple(sorted(options.items())), split, num, seed)
  if key not in _TASKS:
    _TASKS[key] = registry.get_environment(env_name).make_tasks(split, num, seed, **options)
  return _TASKS[key]


# name -> (options, training tasks for the tokenizer, tasks played, expected number of episodes)
CASES = {
    "rooms": ({"difficulty": 3}, lambda o: _tasks("rooms", o, "train", 32, 0),
              lambda o: _tasks("rooms", o, "test", 24, 0), 24),
    "webshop": (WEBSHOP, lambda o: _tasks("webshop", o, "train", 64, 0),
                lambda o: _tasks("webshop", o, "test", 24, 0), 24),
    "swe": ({}, lambda o: _tasks("swe", o, "train", 8, 0), lambda o: _swe_tasks(), 12),
    # The six task types, generated, and the real ALFWorld game among the fixtures.
    "alfworld": ({}, lambda o: _tasks("alfworld", o, "train", 6, 1),
                 lambda o: (_tasks("alfworld", o, "train", 6, 1) + _tasks(
                     "alfworld", {"data_path": os.path.join(FIXTURES, "alfworld", "json_2.1.1")},
                     "valid_seen", 0, 0)), 7),
    "textworld": (TEXTWORLD, lambda o: _tasks("textworld", o, "train", 2, 0),
                  lambda o: _tasks("textworld", o, "train", 2, 0)
                  + _tasks("textworld", o, "test", 1, 0), 3),
}


def play(sandbox, task, replies):
  """(first observation, [(observation, reward, done, success)]) of `replies` from reset."""
  first = sandbox.reset(task)
  steps = []
  for reply in replies:
    step = sandbox.step(reply)
    steps.append((step.observation, step.reward, step.done, step.info.get("success")))
    if step.done:
      break
  return first, steps


def generated_reply(fmt, action):
  """The reply text of `action` as the policy would generate it: its tokens up to and with the
  stop token, then whatever a sampler might add after it, decoded and cut at the stop."""
  tokens = fmt.action_tokens(action)
  assert tokens[-1] in fmt.stop_token_ids
  return fmt.decode_action(tokens + fmt.action_tokens("look")[:3])


def round_trip(env_name, fmt, tasks, options):
  """Per episode: (direct steps == text-path steps, parsed actions == expert actions, total
  direct reward, longest action in tokens)."""
  syntax = registry.get_action_syntax(env_name)
  direct = registry.get_environment(env_name).make_sandbox(**options)
  # The same sandbox behind the parser: a second reset of a task reuses what the first built.
  text_path = free_text.FreeTextSandbox(direct, syntax)
  results = []
  try:
    for task in tasks:
      direct.reset(task)
      actions = direct.expert_actions()
      assert actions, f"no expert for {getattr(task, 'task_id', task)}"
      expected = play(direct, task, actions)
      replies = [generated_reply(fmt, a) for a in actions]
      parsed = [syntax.parse_action(r) for r in replies]
      results.append((play(text_path, task, replies) == expected, parsed == actions,
                      sum(s[1] for s in expected[1]),
                      max(len(fmt.action_tokens(a)) for a in actions)))
  finally:
    direct.close()
  return results


@pytest.mark.parametrize("env_name", [
    "rooms", "webshop", "textworld", pytest.param("alfworld", marks=pytest.mark.slow),
    pytest.param("swe", marks=pytest.mark.slow)])
def test_expert_episodes_survive_the_text_path(env_name, tmp_path):
  options, training, played, expected = CASES[env_name]
  _, fmt = build.build_text(env_name, str(tmp_path), training(options), env_options=options)
  tasks = played(options)
  results = round_trip(env_name, fmt, tasks, options)
  same = sum(r[0] for r in results)
  exact = sum(r[1] for r in results)
  rewarded = sum(r[2] > 0 for r in results)
  figures = (f"{env_name}: {same}/{len(results)} episodes with the same steps and rewards, "
             f"{exact}/{len(results)} with every action parsed back exactly, {rewarded} with a "
             f"positive reward, longest action {max(r[3] for r in results)} tokens, "
             f"vocabulary {fmt.vocab_size}")
  print(figures)
  assert len(results) == expected
  assert same == exact == rewarded == expected, figures


def test_the_check_fails_a_lossy_tokenizer(tmp_path):
  """The same check on a BPE tokenizer whose decoding drops spaces (as a word-level tokenizer
  mangles them): `search[red socks]` comes back as `search[redsocks]`, so no episode plays as
  the expert's and no action parses back."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tasks = _tasks("webshop", WEBSHOP, "test", 10, 0)
  directory = build.ensure_bpe_tokenizer("webshop", str(tmp_path), tasks, env_options=WEBSHOP)
  tokenizer = build.load_tokenizer(directory)
  tokenizer.backend_tokenizer.decoder = tokenizers.decoders.Sequence([
      tokenizer.backend_tokenizer.decoder, tokenizers.decoders.Replace(" ", "")])
  assert tokenizer.decode(tokenizer.encode("search[red socks]", add_special_tokens=False)) == (
      "search[redsocks]")
  fmt = chat.ChatFormat.from_tokenizer(
      tokenizer, system_prompt=registry.get_action_syntax("webshop").system_prompt)
  results = round_trip("webshop", fmt, tasks, WEBSHOP)
  assert sum(r[0] for r in results) == 0 and sum(r[1] for r in results) == 0
