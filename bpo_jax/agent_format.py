"""The conversation format: how an agent's episode becomes tokens and how tokens become actions.

Rollout and supervised warm start both use this module, so the policy is trained on exactly the
token layout it samples in. An episode reads

    prompt       = prompt_prefix + encode(first observation) + action_cue
    action       = encode(action text) + [stop]            (what the policy generates)
    observation  = observation_prefix + encode(observation) + action_cue

and a path through a tree is `prompt, action_1, observation_1, action_2, observation_2, ...`,
which is the `packing.TreeTokens` layout (a node's segment is its action tokens followed by the
observation tokens the sandbox returned). The observation after the last step of an episode
(done) is never read by the policy, so its tokens are empty; its text is kept for display.

With the word-level tokenizer the pieces are single marker tokens:

    prompt:       <bos> <obs> Goal : put the apple in the box . ... <act>
    action:       take apple <stop>
    observation:  <obs> You take the apple . ... <act>

Example:

  tokenizer = WordTokenizer(rooms.vocabulary())
  fmt = AgentFormat.for_word_tokenizer(tokenizer)
  prompt = fmt.prompt_tokens("Goal: put the apple in the box. ...")
  ids = fmt.action_tokens("take apple")          # [id(take), id(apple), id(<stop>)]
  fmt.decode_action(ids)                         # "take apple"
  chain = expert_tree_tokens(fmt, sandbox, task, rooms.expert_actions(task))

A tokenizer is anything with `encode(text) -> list[int]` and `decode(ids) -> str` that adds no
special tokens of its own. For a Hugging Face model, `AgentFormat.for_chat_template(tokenizer)`
reads the pieces off the tokenizer's chat template (observations as user turns, actions as
assistant turns ending with the end-of-turn token) and wraps the tokenizer in `HuggingFaceText`.
`bpo_jax.text.ChatFormat` is the fuller form of that layout (every stop token, observation
pieces tokenised as the template's rendering is, budgets from the template's token counts); it
has the same methods, so `chain_tree_tokens` and `expert_tree_tokens` take it too.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from bpo_jax import packing

PAD, UNK, BOS, OBSERVATION, ACTION, STOP = "<pad>", "<unk>", "<bos>", "<obs>", "<act>", "<stop>"
SPECIAL_TOKENS = (PAD, UNK, BOS, OBSERVATION, ACTION, STOP)

# Marks that attach to the previous word when words are joined back into text.
_CLOSING_PUNCTUATION = frozenset(".,;:!?)")


class Tokenizer(Protocol):
  """What the format needs from a tokenizer (no special tokens added by `encode`)."""

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


def split_words(text: str) -> list[str]:
  """Runs of letters, runs of digits, and each other non-space character.

  >>> split_words("You go north. Out of steps!")
  ['You', 'go', 'north', '.', 'Out', 'of', 'steps', '!']
  """
  return re.findall(r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9\s]", text)


def join_words(words: Iterable[str]) -> str:
  """Inverse of `split_words` up to spacing: closing punctuation attaches to the word before it,
  a hyphen to both neighbours.

  >>> join_words(["You", "see", ":", "red", "key", ".", "one", "-", "way"])
  'You see: red key. one-way'
  """
  text = ""
  glue_next = True
  for word in words:
    if glue_next or word in _CLOSING_PUNCTUATION or word == "-":
      text += word
    else:
      text += " " + word
    glue_next = word == "-"
  return text


class WordTokenizer:
  """A word-level tokenizer over a fixed vocabulary: the special tokens first, then `words`.

  Unknown words map to `<unk>`. Decoding skips `<pad>` and renders the other special tokens by
  name, so a decoded action that holds one is visibly malformed.

  >>> tok = WordTokenizer(["go", "north", "."])
  >>> tok.encode("go north.")
  [6, 7, 8]
  >>> tok.decode([6, 7, 8])
  'go north.'
  """

  def __init__(self, words: Sequence[str]):
    words = list(words)
    duplicates = sorted({w for w in words if words.count(w) > 1})
    if duplicates:
      raise ValueError(f"WordTokenizer: duplicate words {duplicates}")
    clashes = sorted(set(words) & set(SPECIAL_TOKENS))
    if clashes:
      raise ValueError(f"WordTokenizer: words {clashes} clash with the special tokens")
    self.words = list(SPECIAL_TOKENS) + words
    self.index = {w: i for i, w in enumerate(self.words)}

  @property
  def vocab_size(self) -> int:
    return len(self.words)

  def token_id(self, word: str) -> int:
    if word not in self.index:
      raise KeyError(f"{word!r} is not in the vocabulary")
    return self.index[word]

  def encode(self, text: str) -> list[int]:
    unk = self.index[UNK]
    return [self.index.get(w, unk) for w in split_words(text)]

  def decode(self, ids: Sequence[int]) -> str:
    words = []
    for i in ids:
      i = int(i)
      if not 0 <= i < len(self.words):
        raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.words)})")
      if self.words[i] != PAD:
        words.append(self.words[i])
    return join_words(words)


class HuggingFaceText:
  """A Hugging Face tokenizer behind the `Tokenizer` protocol: `encode` adds no special tokens
  (no BOS), `decode` drops them, so a generated end-of-turn token never reaches the sandbox."""

  def __init__(self, tokenizer):
    self.hf_tokenizer = tokenizer

  @property
  def vocab_size(self) -> int:
    return len(self.hf_tokenizer)

  def encode(self, text: str) -> list[int]:
    return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

  def decode(self, ids: Sequence[int]) -> str:
    return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


@dataclasses.dataclass(frozen=True)
class AgentFormat:
  """The token layout of an episode (see the module docstring).

  Attributes:
    tokenizer: encodes observations and actions, decodes generated actions.
    stop_token_id: ends an action; the sampler stops a row when it emits it.
    prompt_prefix: token ids before the first observation.
    observation_prefix: token ids before every later observation.
    action_cue: token ids after every observation, cueing the policy's action.
    max_observation_tokens: observations are cut to this many text tokens (None: no limit), so
      one long page cannot fill the cache; the cut keeps the beginning.
  """

  tokenizer: Any
  stop_token_id: int
  prompt_prefix: tuple[int, ...] = ()
  observation_prefix: tuple[int, ...] = ()
  action_cue: tuple[int, ...] = ()
  max_observation_tokens: int | None = None

  def __post_init__(self):
    for name in ("prompt_prefix", "observation_prefix", "action_cue"):
      object.__setattr__(self, name, tuple(int(t) for t in getattr(self, name)))
    object.__setattr__(self, "stop_token_id", int(self.stop_token_id))
    if self.max_observation_tokens is not None and self.max_observation_tokens < 0:
      raise ValueError(f"max_observation_tokens must be >= 0 or None, got "
                       f"{self.max_observation_tokens}")

  @classmethod
  def for_word_tokenizer(cls, tokenizer: WordTokenizer,
                         max_observation_tokens: int | None = None) -> "AgentFormat":
    """The marker-token layout: `<bos> <obs> ... <act>`, actions end with `<stop>`."""
    return cls(tokenizer=tokenizer, stop_token_id=tokenizer.token_id(STOP),
               prompt_prefix=(tokenizer.token_id(BOS), tokenizer.token_id(OBSERVATION)),
               observation_prefix=(tokenizer.token_id(OBSERVATION),),
               action_cue=(tokenizer.token_id(ACTION),),
               max_observation_tokens=max_observation_tokens)

  @classmethod
  def for_chat_template(cls, tokenizer, system_prompt: str | None = None,
                        max_observation_tokens: int | None = None) -> "AgentFormat":
    """The layout of a Hugging Face tokenizer's chat template (Qwen2.5, Llama 3, ...).

    Observations are user turns and actions assistant turns. The pieces are read off the
    template by rendering placeholder conversations: `prompt_prefix` is everything before the
    first user message, `action_cue` what follows a user message up to the assistant's text
    (the generation prompt), the stop token is the first token after an assistant message (the
    end-of-turn token, e.g. `<|im_end|>`), and `observation_prefix` the rest of the way to the
    next user message. Each piece is tokenized on its own, so rollout and training agree token
    for token even where the template's full rendering would merge differently.

    Raises:
      ValueError: the template does not render the placeholders in the expected places, or
        no special end-of-turn token follows an assistant message.
    """
    first, action, second = "@@observation1@@", "@@action@@", "@@observation2@@"
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    one_turn = head + [{"role": "user", "content": first}]
    two_turns = one_turn + [{"role": "assistant", "content": action},
                            {"role": "user", "content": second}]

    def render(messages):
      return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    text = render(one_turn)
    if text.count(first) != 1:
      raise ValueError(f"the chat template does not render the user message once: {text!r}")
    prefix, cue = text.split(first)
    text = render(two_turns)
    if not (text.count(first) == text.count(action) == text.count(second) == 1
            and text.index(first) < text.index(action) < text.index(second)):
      raise ValueError(f"the chat template does not render a user/assistant/user "
                       f"conversation in order: {text!r}")
    if not text.startswith(prefix) or not text.endswith(cue):
      raise ValueError(f"the chat template's prefix or generation prompt changes with the "
                       f"conversation: {text!r}")
    between = text[text.index(action) + len(action):text.index(second)]
    text_codec = HuggingFaceText(tokenizer)
    between_ids = text_codec.encode(between)
    special = set(getattr(tokenizer, "all_special_ids", ()))
    if not between_ids or between_ids[0] not in special:
      raise ValueError(f"no special end-of-turn token follows an assistant message in the "
                       f"chat template (found {between!r})")
    return cls(tokenizer=text_codec, stop_token_id=between_ids[0],
               prompt_prefix=text_codec.encode(prefix),
               observation_prefix=between_ids[1:], action_cue=text_codec.encode(cue),
               max_observation_tokens=max_observation_tokens)

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """For `sampling.SamplingParams(stop_token_ids=...)`."""
    return (self.stop_token_id,)

  def _observation_text_tokens(self, text: str) -> list[int]:
    if not isinstance(text, str):
      raise TypeError(f"an observation must be text, got {type(text).__name__}")
    ids = list(self.tokenizer.encode(text))
    if self.max_observation_tokens is not None:
      ids = ids[:self.max_observation_tokens]
    return ids

  def prompt_tokens(self, first_observation: str) -> list[int]:
    """The tokens before the first action: the task's first observation states the goal."""
    return (list(self.prompt_prefix) + self._observation_text_tokens(first_observation)
            + list(self.action_cue))

  def observation_tokens(self, observation: str, done: bool = False) -> list[int]:
    """The tokens after an action; empty when the episode is over (`done`)."""
    if done:
      return []
    return (list(self.observation_prefix) + self._observation_text_tokens(observation)
            + list(self.action_cue))

  def action_tokens(self, action: str) -> list[int]:
    """The tokens of an action as the policy should generate it, ending with the stop token."""
    if not isinstance(action, str):
      raise TypeError(f"an action must be text, got {type(action).__name__}")
    ids = list(self.tokenizer.encode(action))
    if self.stop_token_id in ids:
      raise ValueError(f"action {action!r} encodes to the stop token {self.stop_token_id}")
    return ids + [self.stop_token_id]

  def decode_action(self, tokens: Sequence[int]) -> str:
    """The action text of generated tokens: everything before the first stop token, stripped.

    A generation cut by the token limit (no stop token) decodes as it stands; the sandbox judges
    whether it is a usable action.
    """
    tokens = [int(t) for t in tokens]
    if self.stop_token_id in tokens:
      tokens = tokens[:tokens.index(self.stop_token_id)]
    return self.tokenizer.decode(tokens).strip()


def chain_tree_tokens(fmt: AgentFormat, first_observation: str, actions: Sequence[str],
                      observations: Sequence[str], done: bool = True,
                      action_logprobs: Sequence[Sequence[float]] | None = None
                      ) -> packing.TreeTokens:
  """One episode as a chain-shaped `TreeTokens` (node i's parent is i - 1).

  Args:
    fmt: the conversation format.
    first_observation: what `reset` returned.
    actions: the action texts, in order.
    observations: the observation after each action (same length as `actions`).
    done: the last action ended the episode (its observation tokens are then empty).
    action_logprobs: per action, the behaviour logprob of each token; zeros when not given
      (e.g. expert actions, which a supervised loss does not weight by).

  Example:
    chain_tree_tokens(fmt, "Goal: ...", ["take apple"], ["You won!"]).num_nodes == 1
  """
  if len(actions) != len(observations):
    raise ValueError(f"{len(actions)} actions but {len(observations)} observations")
  action_tokens = [np.asarray(fmt.action_tokens(a), np.int32) for a in actions]
  if action_logprobs is None:
    logprobs = [np.zeros(len(t), np.float32) for t in action_tokens]
  else:
    if len(action_logprobs) != len(actions):
      raise ValueError(f"{len(action_logprobs)} logprob lists for {len(actions)} actions")
    logprobs = [np.asarray(lp, np.float32) for lp in action_logprobs]
  last = len(actions) - 1
  observation_tokens = [
      np.asarray(fmt.observation_tokens(o, done=done and i == last), np.int32)
      for i, o in enumerate(observations)]
  return packing.TreeTokens(prompt=np.asarray(fmt.prompt_tokens(first_observation), np.int32),
                            parent=np.arange(len(actions), dtype=np.int32) - 1,
                            action_tokens=action_tokens, action_logprobs=logprobs,
                            observation_tokens=observation_tokens)


@dataclasses.dataclass
class ExpertEpisode:
  """An expert's episode played in a sandbox: its tokens, texts and outcome."""

  tokens: packing.TreeTokens
  first_observation: str
  actions: list[str]
  observations: list[str]
  rewards: list[float]
  done: bool
  success: bool


def expert_tree_tokens(fmt: AgentFormat, sandbox, task: Any, actions: Sequence[str]
                       ) -> ExpertEpisode:
  """Plays `actions` in `sandbox` from `task` and returns the episode as a chain of tokens.

  Stops early if the episode ends before the actions run out (the rest are dropped). Raises
  ValueError if `actions` is empty.
  """
  if not actions:
    raise ValueError("expert_tree_tokens needs at least one action")
  first_observation = sandbox.reset(task)
  taken, observations, rewards = [], [], []
  done = success = False
  for action in actions:
    step = sandbox.step(action)
    taken.append(action)
    observations.append(step.observation)
    rewards.append(float(step.reward))
    if step.done:
      done = True
      success = bool(step.info.get("success", False))
      break
  tokens = chain_tree_tokens(fmt, first_observation, taken, observations, done=done)
  return ExpertEpisode(tokens=tokens, first_observation=first_observation, actions=taken,
                       observations=observations, rewards=rewards, done=done, success=success)
