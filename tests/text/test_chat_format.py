"""The chat format against Hugging Face's own rendering, for Qwen2.5- and Llama 3.1-style
tokenizers (the families' special tokens, pre-tokenizers and chat templates) and the
from-scratch ChatML tokenizer."""

import os

import numpy as np
import pytest

from bpo_jax import text
from bpo_jax.sandboxes import registry, rooms
from bpo_jax.testing import chat_tokenizers
from bpo_jax.text import bpe, chat, corpus

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "fixtures", "chat_templates")
FAMILY_TEMPLATES = {"qwen2": "qwen2_5.jinja", "llama3": "llama3_1.jinja"}
SYSTEM = "Reply with one command."

# An episode with what the pieces must survive: multi-line replies, punctuation, digits, text
# with surrounding whitespace (Llama's template trims it), non-ASCII text.
FIRST = "Goal: put the apple in the box. You are in the hall.\nExits: north."
ACTIONS = ["search[Meridian Clip in Hair Extensions, Heat Resistant]", "click[B0B34SD43W]",
           "replace m.py\n<<<<<<< SEARCH\n    return x - 1\n=======\n    return x\n"
           ">>>>>>> REPLACE", "  go north  "]
OBSERVATIONS = ["Page 1 (Total results: 50) [SEP] Next > [SEP] B0B34SD43W", "\n  Café 3 × 4  \n",
                "Replaced 1 lines with 1 lines in m.py.", "You won!"]


@pytest.fixture(scope="module")
def corpus_texts():
  texts = corpus.environment_texts("rooms", rooms.make_tasks("train", 8, seed=0))
  texts += [FIRST, *ACTIONS, *OBSERVATIONS] * 3
  # The family tokenizers learn their role names and header newlines as single tokens.
  return [t.replace("<|im_start|>", "").replace("<|im_end|>", "") for t in texts] + [
      "system\n\nuser\n\nassistant\n\n"] * 20


@pytest.fixture(scope="module", params=["qwen2", "llama3"])
def family(request, corpus_texts):
  with open(os.path.join(TEMPLATES, FAMILY_TEMPLATES[request.param])) as f:
    template = f.read()
  tok = chat_tokenizers.family_tokenizer(request.param, corpus_texts, template)
  fmt = chat.ChatFormat.from_tokenizer(
      tok, system_prompt=SYSTEM,
      eos_token_ids=chat_tokenizers.generation_eos_ids(tok, request.param))
  return request.param, tok, fmt


def rendered_ids(tok, messages, add_generation_prompt=False):
  return list(tok.apply_chat_template(messages, tokenize=True, return_dict=False,
                                      add_generation_prompt=add_generation_prompt))


def episode_ids(fmt, first, actions, observations, done=True):
  ids = fmt.prompt_tokens(first)
  for t, (a, o) in enumerate(zip(actions, observations)):
    ids += fmt.action_tokens(a) + fmt.observation_tokens(o, done=done and t == len(actions) - 1)
  return ids


def test_pieces_are_read_off_the_template(family):
  name, tok, fmt = family
  tokens = lambda ids: tok.convert_ids_to_tokens(ids)
  if name == "qwen2":
    assert fmt.prompt_head == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    assert fmt.cue == "<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.observation_head == "\n<|im_start|>user\n"
    assert tokens(fmt.observation_tokens("x")) == [
        "Ċ", "<|im_start|>", "user", "Ċ", "x", "<|im_end|>", "Ċ", "<|im_start|>", "assistant",
        "Ċ"]
    assert tokens(fmt.stop_token_ids) == ["<|im_end|>", "<|endoftext|>"]
  else:
    assert fmt.prompt_head == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
        f"December 2023\nToday Date: 26 Jul 2024\n\n{SYSTEM}<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\n")
    assert fmt.cue == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert fmt.observation_head == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert tokens(fmt.observation_tokens("x")) == [
        "<|start_header_id|>", "user", "<|end_header_id|>", "ĊĊ", "x", "<|eot_id|>",
        "<|start_header_id|>", "assistant", "<|end_header_id|>", "ĊĊ"]
    assert tokens(fmt.stop_token_ids) == ["<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"]
  assert fmt.observation_overhead == 9
  assert fmt.turn_end_id == fmt.stop_token_ids[0]
  assert fmt.action_tokens("go north")[-1] == fmt.turn_end_id
  # The prompt's overhead is its tokens besides the observation's.
  for text in (FIRST, "x", "3 apples"):
    assert len(fmt.prompt_tokens(text)) == fmt.prompt_overhead + len(
        tok.encode(text, add_special_tokens=False))


def test_episode_is_the_templates_rendering(family):
  name, tok, fmt = family
  messages = fmt.messages(FIRST, ACTIONS, OBSERVATIONS)
  assert messages[0] == {"role": "system", "content": SYSTEM}
  assert messages[-1] == {"role": "assistant", "content": "go north"}
  assert len(messages) == 2 + 2 * len(ACTIONS) - 1
  ids = episode_ids(fmt, FIRST, ACTIONS, OBSERVATIONS)
  full = rendered_ids(tok, messages)
  # ChatML closes the last turn with a newline after <|im_end|>; Llama 3 with nothing.
  trailer = {"qwen2": tok.encode("\n", add_special_tokens=False), "llama3": []}[name]
  assert full == ids + trailer
  raw = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
  for a, o in zip(ACTIONS, OBSERVATIONS):
    raw += [{"role": "assistant", "content": a}, {"role": "user", "content": o}]
  # Llama's template trims the texts as the format does; ChatML keeps their whitespace.
  assert (rendered_ids(tok, raw[:-1]) == full) == (name == "llama3")
  # An episode cut before its end: the rendering with the generation prompt.
  ids = episode_ids(fmt, FIRST, ACTIONS[:2], OBSERVATIONS[:2], done=False)
  messages = fmt.messages(FIRST, ACTIONS[:2], OBSERVATIONS[:2], done=False)
  assert rendered_ids(tok, messages, add_generation_prompt=True) == ids
  # Every token of the prompt and the observations is where the template puts it.
  assert ids[:len(fmt.prompt_tokens(FIRST))] == rendered_ids(tok, messages[:2], True)


def test_decode_cuts_at_any_stop_token(family):
  _, tok, fmt = family
  reply = ACTIONS[2]
  body = tok.encode(reply, add_special_tokens=False)
  junk = tok.encode("go south", add_special_tokens=False)
  for stop in fmt.stop_token_ids:
    assert fmt.decode_action(body + [stop] + junk) == reply
  assert fmt.decode_action(fmt.action_tokens(reply)) == reply
  # No stop token (cut by the token limit): the text as it stands.
  assert fmt.decode_action(body[:5]) == tok.decode(body[:5]).strip()
  # After a reply cut before any stop token the observation closes the turn.
  assert fmt.observation_tokens("x", reply_ended=False) == (
      [fmt.turn_end_id] + fmt.observation_tokens("x"))
  assert fmt.observation_tokens("x", done=True, reply_ended=False) == []
  with pytest.raises(ValueError, match="encodes to the stop token"):
    fmt.action_tokens("go" + tok.convert_ids_to_tokens(fmt.turn_end_id))


def test_observation_budget(family):
  _, tok, fmt = family
  limit = 12
  cut = chat.ChatFormat.from_tokenizer(tok, system_prompt=SYSTEM, max_observation_tokens=limit)
  long = " ".join(["The red key lies on the table in the kitchen."] * 6)
  for text in (long, OBSERVATIONS[0], "x", "Café " * 10, "\n".join(["ab"] * 20)):
    n = len(tok.encode(text.strip(), add_special_tokens=False))
    piece = cut.observation_tokens(text)
    assert len(piece) <= cut.observation_overhead + limit
    if n <= limit:
      assert piece == fmt.observation_tokens(text)
    else:
      assert len(piece) >= cut.observation_overhead + limit - 3
    assert len(cut.prompt_tokens(text)) <= cut.prompt_overhead + limit
  text = cut.observation_text(long)
  assert long.startswith(text) and len(text) < len(long)
  # The cut episode is still the rendering of its (cut) conversation.
  ids = episode_ids(cut, long, ["go north"], [long], done=False)
  messages = cut.messages(long, ["go north"], [long], done=False)
  assert rendered_ids(tok, messages, add_generation_prompt=True) == ids
  # A path of T turns fits the bound, which is built from the template's counts.
  turns, action_tokens = 4, 40
  bound = cut.path_token_bound(turns, action_tokens)
  assert bound == (cut.prompt_overhead + limit + turns * action_tokens
                   + (turns - 1) * (cut.observation_overhead + 1 + limit))
  worst = episode_ids(cut, long, [ACTIONS[0]] * turns, [long] * turns, done=True)
  assert len(worst) <= bound
  # Replies cut by the token limit (no stop token): each observation closes the turn.
  reply = tok.encode(" ".join(["search"] * 60), add_special_tokens=False)[:action_tokens]
  cut_path = cut.prompt_tokens(long)
  for _ in range(turns - 1):
    cut_path += reply + cut.observation_tokens(long, reply_ended=False)
  cut_path += reply
  assert len(cut_path) == bound
  assert fmt.path_token_bound(turns, action_tokens) is None


def test_from_scratch_tokenizer_layout(tmp_path):
  texts = corpus.environment_texts("rooms", rooms.make_tasks("train", 8, seed=0))
  bpe.save_bpe(bpe.train_bpe(texts, 512), str(tmp_path / "tok"))
  import transformers  # pylint: disable=g-import-not-at-top
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
  syntax = registry.get_action_syntax("rooms")
  fmt = chat.ChatFormat.from_tokenizer(tok, syntax.system_prompt, eos_token_ids=(2, 0))
  assert fmt.stop_token_ids == (2, 0) and fmt.turn_end_id == 2
  assert fmt.observation_overhead == 9  # \n <|im_start|> user \n ... <|im_end|> \n ... \n
  messages = fmt.messages(FIRST, ACTIONS, OBSERVATIONS)
  full = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
  assert full == episode_ids(fmt, FIRST, ACTIONS, OBSERVATIONS) + tok.encode("\n")
  assert fmt.vocab_size == len(tok)


def test_chain_and_expert_tokens_take_the_chat_format(family):
  _, tok, fmt = family
  task = rooms.make_tasks("train", 1, seed=3)[0]
  sandbox = registry.make_free_text_sandbox("rooms")
  episode = text.expert_tree_tokens(fmt, sandbox, task, rooms.expert_actions(task))
  assert episode.success and episode.done
  path = list(episode.tokens.prompt)
  for a, o in zip(episode.tokens.action_tokens, episode.tokens.observation_tokens):
    path += list(a) + list(o)
  messages = fmt.messages(episode.first_observation, episode.actions, episode.observations)
  full = rendered_ids(tok, messages)
  assert full[:len(path)] == path and len(full) - len(path) in (0, 1)
  assert np.all(episode.tokens.parent == np.arange(len(episode.actions)) - 1)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template, message", [
    (None, "the tokenizer has no chat template"),
    ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}"
     "{% endfor %}", "does not render a user/assistant/user conversation"),
    ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
     "{% if add_generation_prompt %}assistant: {% endif %}", "no special end-of-turn token"),
    # A generation prompt ending in a space: byte-level BPE joins it to the reply's first word.
    ("{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>"
     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}",
     "does not tokenise as its turns do"),
    ("{{ raise_exception('System role not supported') }}", "cannot render"),
])
def test_unusable_templates_are_named(template, message, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  bpe.save_bpe(bpe.train_bpe(["user: go north assistant: take key"] * 20, 300),
               str(tmp_path / "tok"))
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
  tok.chat_template = template
  with pytest.raises(chat.TokenizerError, match=message) as error:
    chat.ChatFormat.from_tokenizer(tok)
  assert "\n" not in str(error.value)
  assert isinstance(error.value, ValueError)
  tok.chat_template = CHATML
  with pytest.raises(ValueError, match="max_observation_tokens must be >= 1"):
    chat.ChatFormat.from_tokenizer(tok, max_observation_tokens=0)
