"""Reading large JSON files one element at a time, with a digest of their bytes.

WebShop's product file is one JSON array of 1.18M products (several GB); loading it with one
`json.load` holds the whole text and every parsed record at once. `JsonStream` reads the file
in chunks and hands out the elements of a top-level array (`iter_array`) or the members of a
top-level object (`iter_object`) one by one, each parsed with `json.JSONDecoder.raw_decode`,
so at most one chunk and one element are held besides what the caller keeps. Every byte read
goes into a SHA-256, and `close()` reads the rest of the file into it, so `digest()` names the
whole file however much of it was parsed.

A file that cannot be opened or is not valid JSON raises `TaskInputError` (the user's data to
fix) in one line naming the file, the element or member being read and the character offset
in the file.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import os
import re
from typing import Any, Iterator

from bpo_jax.sandboxes.base import TaskInputError

CHUNK_BYTES = 1 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class JsonStream:
  """One JSON file, read forward in chunks. `what` names the file in error messages."""

  def __init__(self, path: str | os.PathLike[str], what: str):
    self.path = os.fspath(path)
    self.what = what
    try:
      self._file = open(self.path, "rb")
    except OSError as e:  # missing, a directory, unreadable
      raise TaskInputError(f"WebShop {what} file {self.path!r}: {e.strerror or e}") from None
    self._sha = hashlib.sha256()
    self._utf8 = codecs.getincrementaldecoder("utf-8")()
    self._decoder = json.JSONDecoder()
    self._buf = ""
    self._pos = 0
    self._offset = 0  # characters of the file before the buffer's start
    self._eof = False
    self._where = "the top level"  # what is being read, for error messages

  def __enter__(self) -> "JsonStream":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _error(self, reason: str, pos: int | None = None) -> TaskInputError:
    at = self._offset + (self._pos if pos is None else pos)
    return TaskInputError(f"WebShop {self.what} file {self.path!r} is not valid JSON: {reason} "
                          f"(in {self._where}, character {at} of the file)")

  def _fill(self) -> bool:
    """Appends the next chunk to the buffer; False at the end of the file."""
    if self._eof:
      return False
    chunk = self._file.read(CHUNK_BYTES)
    self._sha.update(chunk)
    try:
      text = self._utf8.decode(chunk, final=not chunk)
    except UnicodeDecodeError as e:
      raise self._error(f"not UTF-8 ({e.reason})") from None
    self._eof = not chunk
    self._offset += self._pos
    self._buf = self._buf[self._pos:] + text
    self._pos = 0
    return not self._eof

  def _peek(self) -> str:
    """The next character that is not whitespace ('' at the end of the file)."""
    while True:
      self._pos = _WHITESPACE.match(self._buf, self._pos).end()
      if self._pos < len(self._buf):
        return self._buf[self._pos]
      if not self._fill():
        return ""

  def _expect(self, chars: str) -> str:
    c = self._peek()
    if not c or c not in chars:
      found = repr(c) if c else "the end of the file"
      raise self._error(f"expected one of {list(chars)}, found {found}")
    self._pos += 1
    return c

  def _value(self) -> Any:
    """The next complete JSON value; reads more chunks until it is whole."""
    self._peek()
    while True:
      try:
        value, end = self._decoder.raw_decode(self._buf, self._pos)
      except json.JSONDecodeError as e:
        if self._fill():
          continue
        raise self._error(e.msg, e.pos) from None
      # A number at the end of the buffer may continue in the next chunk.
      if end == len(self._buf) and self._fill():
        continue
      self._pos = end
      return value

  def _end(self) -> None:
    """Checks that nothing but whitespace follows the top-level value."""
    self._where = "the end of the file"
    if self._peek():
      raise self._error("text after the top-level value")

  def iter_array(self) -> Iterator[Any]:
    """The elements of the top-level array, in order."""
    self._expect("[")
    if self._peek() == "]":
      self._pos += 1
      self._end()
      return
    for i in itertools.count():
      self._where = f"element {i}"
      yield self._value()
      self._where = f"the array after element {i}"
      if self._expect(",]") == "]":
        self._end()
        return

  def iter_object(self) -> Iterator[tuple[str, Any]]:
    """The (key, value) members of the top-level object, in order."""
    self._expect("{")
    if self._peek() == "}":
      self._pos += 1
      self._end()
      return
    key = None
    while True:
      self._where = "the first member" if key is None else f"the member after {key!r}"
      if self._peek() != '"':
        raise self._error("expected a string key")
      key = self._value()
      self._where = f"member {key!r}"
      self._expect(":")
      yield key, self._value()
      self._where = f"the object after member {key!r}"
      if self._expect(",}") == "}":
        self._end()
        return

  def close(self) -> None:
    """Reads what is left of the file into the digest and closes it."""
    if self._file.closed:
      return
    while chunk := self._file.read(CHUNK_BYTES * 8):
      self._sha.update(chunk)
    self._eof = True
    self._file.close()

  def digest(self) -> str:
    """SHA-256 of the file's bytes (all of them once `close()` has run)."""
    return self._sha.hexdigest()
