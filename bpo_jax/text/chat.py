"""The chat format: an agent's episode as the turns of a Hugging Face chat template.

Observations are user turns and the agent's replies assistant turns, exactly as the tokenizer's
own chat template renders them. With `P` the template's text before the first user message,
`C` its generation prompt (what follows a user message up to the assistant's text), `E` the
end-of-turn token after an assistant message and `H` the rest of the way to the next user
message, an episode reads

    prompt       = tokens(P + observation_1 + C)
    action_t     = tokens(reply_t) + [E]                   (what the policy generates)
    observation_t = tokens(H + observation_{t+1} + C)      (empty after the last step)

and `prompt + action_1 + observation_1 + ... + action_T` is the template's rendering of the
conversation (`messages`) tokenised, token for token. For Qwen2.5's ChatML template

    P = "<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n"
    C = "<|im_end|>\\n<|im_start|>assistant\\n"      E = <|im_end|>
    H = "\\n<|im_start|>user\\n"

and for Llama 3.1's, `P` starts with `<|begin_of_text|>` and the system header, `C` is
`<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n`, `E` is `<|eot_id|>` and `H` is
`<|start_header_id|>user<|end_header_id|>\\n\\n`. The pieces are read off the template by
rendering placeholder conversations (`ChatFormat.from_tokenizer`), never written in by hand.

Each observation piece is tokenised as one text with the template's text around it, as the full
rendering is; a reply is tokenised on its own, because the policy generates it after `C`, so the
tokenizer must not merge `C`'s last characters with a reply's first ones (checked on probe
conversations when the format is built, `check_probe_conversations`). Texts are stripped of surrounding whitespace (Llama's
template trims them; ChatML's would keep it), and a literal special-token string inside an
observation tokenises as that special token, as it does in the template's own tokenisation.

A generated reply ends at the first of `stop_token_ids`: the end-of-turn token, the tokenizer's
eos token and generation_config.json's `eos_token_id` (Qwen ends turns with `<|im_end|>` and
sequences with `<|endoftext|>`; Llama 3 with `<|eot_id|>` and `<|end_of_text|>`).

Budgets come from the template's token counts: an observation piece holds at most
`observation_overhead + max_observation_tokens` tokens (the prompt `prompt_overhead + ...`), and
`path_token_bound` adds them up for a path (an observation after a reply cut by the token limit
starts with the end-of-turn token the reply lacks: one token more).

    fmt = ChatFormat.from_tokenizer(tokenizer, system_prompt=syntax.system_prompt)
    prompt = fmt.prompt_tokens("WebShop [SEP] Instruction: ...")
    ids = fmt.action_tokens("search[red socks]")      # ... + [<|im_end|>]
    fmt.decode_action(ids)                            # "search[red socks]"
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

# Placeholders rendered through the template to find its pieces.
_FIRST, _REPLY, _SECOND = "@@observation1@@", "@@reply@@", "@@observation2@@"
# Replies whose first characters must not merge with the generation prompt's last ones.
_PROBE_REPLIES = ("go north", "search[red socks]", "click[B0 1]", "run ls -la\nls", "3 apples",
                  "(look)", "Submit.")
# A probe observation for the overheads (a letter, which merges with nothing around it).
_PROBE = "x"


class TokenizerError(ValueError):
  """A tokenizer (or its directory) that cannot serve the chat format; the message is one line
  that names the problem (the command line reports it with exit status 2)."""


def _encode(tokenizer, text: str) -> list[int]:
  return list(tokenizer.encode(text, add_special_tokens=False))


def _template_pieces(tokenizer, system_prompt: str | None) -> tuple[str, str, str]:
  """(text before the first observation, generation prompt, text from an assistant message's
  end to the next observation) of the tokenizer's chat template."""
  if not getattr(tokenizer, "chat_template", None):
    raise TokenizerError("the tokenizer has no chat template (tokenizer_config.json "
                         "'chat_template' or chat_template.jinja)")
  head = [{"role": "system", "content": system_prompt}] if system_prompt else []
  one = head + [{"role": "user", "content": _FIRST}]
  two = one + [{"role": "assistant", "content": _REPLY}, {"role": "user", "content": _SECOND}]
  try:
    text_one = tokenizer.apply_chat_template(one, tokenize=False, add_generation_prompt=True)
    text_two = tokenizer.apply_chat_template(two, tokenize=False, add_generation_prompt=True)
  except Exception as e:  # pylint: disable=broad-except
    raise TokenizerError(f"the chat template cannot render a user/assistant/user conversation: "
                         f"{type(e).__name__}: {e}") from None
  if text_one.count(_FIRST) != 1:
    raise TokenizerError(f"the chat template does not render the user message once: "
                         f"{text_one!r}")
  prefix, cue = text_one.split(_FIRST)
  start = prefix + _FIRST + cue + _REPLY
  rest = text_two[len(start):]
  if (not text_two.startswith(start) or rest.count(_SECOND) != 1
      or not rest.endswith(_SECOND + cue)):
    raise TokenizerError(f"the chat template does not render a user/assistant/user "
                         f"conversation as turns that follow each other: {text_two!r}")
  return prefix, cue, rest[:rest.index(_SECOND)]


def _turn_end(tokenizer, between: str) -> tuple[int, str]:
  """The special token that ends an assistant message, and the text after it."""
  ids = _encode(tokenizer, between)
  special = set(getattr(tokenizer, "all_special_ids", ())) | set(
      getattr(tokenizer, "added_tokens_decoder", {}) or {})
  if not ids or ids[0] not in special:
    raise TokenizerError(f"no special end-of-turn token follows an assistant message in the "
                         f"chat template (found {between!r})")
  token = tokenizer.convert_ids_to_tokens(ids[0])
  if not between.startswith(token):
    raise TokenizerError(f"the end-of-turn token {token!r} is not the text after an assistant "
                         f"message ({between!r})")
  return ids[0], between[len(token):]


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """The token layout of an episode in a tokenizer's chat template (see the module docstring).

  Build it with `from_tokenizer`. Rollout and `episodes.py` lay episodes out with it.

  Attributes:
    tokenizer: a Hugging Face tokenizer with a chat template.
    system_prompt: the system turn's text (None: none, or the template's default).
    prompt_head: the template's text before the first observation.
    cue: the generation prompt, after every observation.
    observation_head: the text from the end-of-turn token to a later observation.
    turn_end_id: the end-of-turn token, appended to every expert reply.
    stop_token_ids: every token that ends a generated reply (`turn_end_id` first).
    prompt_overhead: the prompt's tokens besides the first observation's.
    observation_overhead: an observation piece's tokens besides the observation's.
    max_observation_tokens: observations are cut to this many tokens (None: no limit).
  """

  tokenizer: Any
  system_prompt: str | None
  prompt_head: str
  cue: str
  observation_head: str
  turn_end_id: int
  stop_token_ids: tuple[int, ...]
  prompt_overhead: int
  observation_overhead: int
  max_observation_tokens: int | None = None

  @classmethod
  def from_tokenizer(cls, tokenizer, system_prompt: str | None = None,
                     eos_token_ids: Sequence[int] = (),
                     max_observation_tokens: int | None = None) -> "ChatFormat":
    """Reads the pieces off `tokenizer.chat_template`.

    Args:
      tokenizer: a Hugging Face tokenizer.
      system_prompt: the system turn (e.g. the environment's `SYSTEM_PROMPT`).
      eos_token_ids: more ids that end a reply (generation_config.json's `eos_token_id`).
      max_observation_tokens: cut observations to this many tokens (None: no limit).

    Raises:
      TokenizerError: no chat template; a template that does not render user and assistant
        turns one after the other, or ends an assistant turn without a special token; a
        tokenizer that merges the generation prompt with a reply.
    """
    if max_observation_tokens is not None and max_observation_tokens < 1:
      raise ValueError(f"max_observation_tokens must be >= 1 or None, got "
                       f"{max_observation_tokens}")
    prefix, cue, between = _template_pieces(tokenizer, system_prompt)
    turn_end_id, observation_head = _turn_end(tokenizer, between)
    stops = [turn_end_id, getattr(tokenizer, "eos_token_id", None), *eos_token_ids]
    probe = _encode(tokenizer, _PROBE)
    fmt = cls(tokenizer=tokenizer, system_prompt=system_prompt, prompt_head=prefix, cue=cue,
              observation_head=observation_head, turn_end_id=int(turn_end_id),
              stop_token_ids=tuple(dict.fromkeys(int(i) for i in stops if i is not None)),
              prompt_overhead=len(_encode(tokenizer, prefix + _PROBE + cue)) - len(probe),
              observation_overhead=len(_encode(tokenizer, observation_head + _PROBE + cue))
              - len(probe),
              max_observation_tokens=max_observation_tokens)
    fmt.check_probe_conversations()
    return fmt

  def check_probe_conversations(self):
    """Raises TokenizerError unless short probe conversations tokenise, in the template's own
    rendering, exactly as their pieces do (e.g. a tokenizer that merges the generation prompt's
    last characters with a reply's first ones, or special tokens that swallow whitespace)."""
    for reply in _PROBE_REPLIES:
      messages = self.messages(_PROBE, [reply], [_PROBE], done=False)
      rendered = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=True)
      pieces = (self.prompt_tokens(_PROBE) + self.action_tokens(reply)
                + self.observation_tokens(_PROBE))
      if _encode(self.tokenizer, rendered) != pieces:
        raise TokenizerError(f"the chat template's rendering of a conversation with the reply "
                             f"{reply!r} does not tokenise as its turns do (the tokenizer merges "
                             f"the generation prompt {self.cue!r} with the reply, or a special "
                             "token swallows the whitespace beside it)")

  @property
  def vocab_size(self) -> int:
    """Token ids run over [0, vocab_size): the tokenizer's length, added tokens included."""
    return len(self.tokenizer)

  def _piece(self, head: str, observation: str, overhead: int) -> tuple[list[int], str]:
    """The tokens of `head + observation + cue` with the observation cut to fit the budget
    (`overhead + max_observation_tokens` tokens), and the observation text they hold."""
    if not isinstance(observation, str):
      raise TypeError(f"an observation must be text, got {type(observation).__name__}")
    text = observation.strip()
    ids = _encode(self.tokenizer, head + text + self.cue)
    limit = self.max_observation_tokens
    if limit is None or len(ids) <= overhead + limit:
      return ids, text
    body = _encode(self.tokenizer, text)
    # Cut at a token boundary; a cut can re-tokenise longer (a split word, a split character),
    # so shorten until the piece fits.
    for keep in range(min(limit, len(body)), -1, -1):
      text = self.tokenizer.decode(body[:keep], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False).strip()
      ids = _encode(self.tokenizer, head + text + self.cue)
      if len(ids) <= overhead + limit:
        break
    return ids, text

  def observation_text(self, observation: str, first: bool = False) -> str:
    """The observation as the policy sees it: stripped, and cut to the token budget."""
    head, overhead = ((self.prompt_head, self.prompt_overhead) if first
                      else (self.observation_head, self.observation_overhead))
    return self._piece(head, observation, overhead)[1]

  def prompt_tokens(self, first_observation: str) -> list[int]:
    """The tokens before the first reply: system turn, the first observation, the cue."""
    return self._piece(self.prompt_head, first_observation, self.prompt_overhead)[0]

  def observation_tokens(self, observation: str, done: bool = False,
                         reply_ended: bool = True) -> list[int]:
    """The tokens after a reply's end-of-turn token; empty when the episode is over.

    `reply_ended=False`: the reply was cut by the token limit before any stop token, so the
    piece starts with the end-of-turn token the template puts after an assistant message (the
    policy's context stays a well-formed conversation; the token is not the policy's action).
    """
    if done:
      return []
    ids = self._piece(self.observation_head, observation, self.observation_overhead)[0]
    return ids if reply_ended else [self.turn_end_id] + ids

  def action_tokens(self, action: str) -> list[int]:
    """The tokens of a reply as the policy should generate it, ending with the end-of-turn
    token. Raises ValueError if the text itself encodes to a stop token."""
    if not isinstance(action, str):
      raise TypeError(f"an action must be text, got {type(action).__name__}")
    ids = _encode(self.tokenizer, action.strip())
    stops = [i for i in ids if i in self.stop_token_ids]
    if stops:
      raise ValueError(f"action {action!r} encodes to the stop token {stops[0]}")
    return ids + [self.turn_end_id]

  def decode_action(self, tokens: Sequence[int]) -> str:
    """The reply text of generated tokens: everything before the first stop token, special
    tokens dropped, stripped. A reply cut by the token limit decodes as it stands; the
    environment's parser then looks for an action in it."""
    tokens = [int(t) for t in tokens]
    cut = next((i for i, t in enumerate(tokens) if t in self.stop_token_ids), len(tokens))
    return self.tokenizer.decode(tokens[:cut], skip_special_tokens=True,
                                 clean_up_tokenization_spaces=False).strip()

  def messages(self, first_observation: str, actions: Sequence[str],
               observations: Sequence[str], done: bool = True) -> list[dict[str, str]]:
    """The conversation whose template rendering the episode's tokens are: the system turn,
    the observations (as `observation_text`) as user turns, the replies as assistant turns; the
    last observation is left out when `done`."""
    if len(actions) != len(observations):
      raise ValueError(f"{len(actions)} actions but {len(observations)} observations")
    out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
    out.append({"role": "user", "content": self.observation_text(first_observation, True)})
    for t, (action, observation) in enumerate(zip(actions, observations)):
      out.append({"role": "assistant", "content": action.strip()})
      if not (done and t == len(actions) - 1):
        out.append({"role": "user", "content": self.observation_text(observation)})
    return out

  def path_token_bound(self, max_turns: int, max_action_tokens: int) -> int | None:
    """Most tokens of one path: the prompt, `max_turns` replies of at most `max_action_tokens`
    tokens (end-of-turn included) and the `max_turns - 1` observations between them, each with
    the end-of-turn token a cut reply lacks. None when observations are not cut (no bound is
    known before the rollout)."""
    if self.max_observation_tokens is None:
      return None
    n = self.max_observation_tokens
    return (self.prompt_overhead + n + max_turns * max_action_tokens
            + (max_turns - 1) * (self.observation_overhead + 1 + n))
