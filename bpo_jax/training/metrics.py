"""Metrics: per-iteration records to a JSONL file, TensorBoard and the console; success intervals.

Each record is a flat dict of JSON numbers and strings with an `iteration` and a `phase`
("warm_start", "train" or "eval"). `MetricsWriter` appends it as one line of
`<workdir>/metrics.jsonl` (flushed at once, so a killed run loses nothing it reported; a
resumed run rewrites the file whole from its checkpoint's history, so records past the
checkpoint, or a line cut short, are replaced by those the run computes again), writes
its numbers as TensorBoard scalars under `<workdir>/tensorboard` (with the `tensorboard`
package's own event writer, which needs no TensorFlow, or `tensorboardX`; skipped with a logged
warning when neither is installed), and shows a progress bar on the console.

Keys whose name starts with `time/` are wall-clock measurements; everything else in a record is
a deterministic function of the configuration (`deterministic_part`).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Any, Iterable, Sequence

from absl import logging

from bpo_jax.training import workdir as workdir_lib

TIME_PREFIX = "time/"


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
  """The Wilson score interval of a binomial success rate.

  With `p = successes / n` and `z` the standard normal quantile at `(1 + confidence) / 2`:

      centre = (p + z²/(2n)) / (1 + z²/n)
      half   = z / (1 + z²/n) · sqrt(p(1 − p)/n + z²/(4n²))

  It stays inside [0, 1] and is not degenerate at 0 or n successes, unlike the normal
  approximation. Example: 8 of 10 at 95% gives (0.4902, 0.9433); 0 of 40 gives (0, 0.0876).
  """
  if trials <= 0:
    raise ValueError(f"trials must be positive, got {trials}")
  if not 0 <= successes <= trials:
    raise ValueError(f"successes must be in [0, {trials}], got {successes}")
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
  n, p = float(trials), successes / trials
  denominator = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denominator
  half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  # At 0 (n) successes the bound is 0 (1) exactly; the formula leaves a rounding residue.
  low = 0.0 if successes == 0 else max(0.0, centre - half)
  high = 1.0 if successes == trials else min(1.0, centre + half)
  return low, high


def deterministic_part(record: dict) -> dict:
  """The record without its wall-clock keys (what an exact resume must reproduce)."""
  return {k: v for k, v in record.items() if not k.startswith(TIME_PREFIX)}


def _json_number(value: Any) -> Any:
  """Python scalars for JSON; NaN and infinities as strings (JSON has no literal for them)."""
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def clean_record(record: dict) -> dict:
  return {k: _json_number(v) for k, v in record.items()}


def read_jsonl(path: str) -> list[dict]:
  """The records of a metrics file (an empty list when it does not exist), without a last line
  cut short."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    text = f.read()
  lines = [line for line in text.split("\n") if line.strip()]
  if lines and not text.endswith("\n"):
    try:  # the last line of a writer killed mid-line
      json.loads(lines[-1])
    except ValueError:
      lines.pop()
  return [json.loads(line) for line in lines]


class ScalarEventWriter:
  """TensorBoard scalars through the `tensorboard` package's event-file writer (no TensorFlow).

  `add_scalar(tag, value, step)` writes one `Event` holding a `simple_value` summary.
  """

  def __init__(self, logdir: str):
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    self._writer = EventFileWriter(logdir)

  def add_scalar(self, tag: str, value: float, step: int):
    value = self._summary.Value(tag=tag, simple_value=float(value))
    self._writer.add_event(self._event(wall_time=time.time(), step=int(step),
                                       summary=self._summary(value=[value])))

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()


def tensorboard_writer(logdir: str):
  """A scalar writer for `logdir`: the `tensorboard` package's, else tensorboardX's, else None
  (with a warning)."""
  try:
    return ScalarEventWriter(logdir)
  except ImportError:
    pass
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
    return tensorboardX.SummaryWriter(logdir)
  except ImportError:
    logging.warning("neither tensorboard nor tensorboardX is installed: no TensorBoard output")
    return None


def eval_line(record: dict) -> str:
  """One line for an evaluation record, e.g. `eval at iteration 10 (train): success 0.906
  [0.810, 0.956] over 64 tasks`."""
  return (f"eval at iteration {record['iteration']} ({record.get('stage', 'train')}): success "
          f"{record['success_rate']:.3f} [{record['success_low']:.3f}, "
          f"{record['success_high']:.3f}] over {record['num_tasks']} tasks")


class MetricsWriter:
  """Writes records to `<workdir>/metrics.jsonl`, TensorBoard and a console progress bar."""

  def __init__(self, workdir: str, tensorboard: bool = True, progress_bar: bool = True,
               total_iterations: int = 0, history: Sequence[dict] = ()):
    """Starts the JSONL file afresh from `history` (the records of a restored checkpoint)."""
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    workdir_lib.write_text(self.path, "".join(json.dumps(record, sort_keys=True) + "\n"
                                              for record in history))
    self._tensorboard = None
    if tensorboard:
      self._tensorboard = tensorboard_writer(os.path.join(workdir, "tensorboard"))
    self._bar = None
    if progress_bar and total_iterations > 0:
      import tqdm  # pylint: disable=g-import-not-at-top
      done = sum(1 for r in history if r.get("phase") == "train")
      self._bar = tqdm.tqdm(total=total_iterations, initial=done, desc="train", unit="it",
                            dynamic_ncols=True)
      for record in history:  # the evaluations made before the bar (iteration 0), under it
        if record.get("phase") == "eval":
          self._bar.write(eval_line(record))

  def write(self, record: dict) -> dict:
    """Appends `record` (cleaned for JSON) and returns it."""
    record = clean_record(record)
    try:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
    except OSError as error:
      raise workdir_lib.WriteError(error.errno, f"cannot write {self.path}: "
                                   f"{error.strerror or error}") from None
    if self._tensorboard is not None:
      phase, step = record.get("phase", "train"), int(record.get("iteration", 0))
      for key, value in record.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
          self._tensorboard.add_scalar(f"{phase}/{key}", value, step)
      self._tensorboard.flush()
    if record.get("phase") == "train":
      self._progress(record)
    elif record.get("phase") == "eval":
      if self._bar is not None:
        self._bar.write(eval_line(record))
      else:
        logging.info("%s", eval_line(record))
    return record

  def _progress(self, record: dict):
    summary = {k: record[k] for k in ("success", "loss", "grad_norm") if k in record}
    text = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in summary.items())
    if self._bar is not None:
      self._bar.update(1)
      self._bar.set_postfix_str(text)
    else:
      logging.info("iteration %d: %s", record.get("iteration", -1), text)

  def close(self):
    if self._bar is not None:
      self._bar.close()
    if self._tensorboard is not None:
      self._tensorboard.close()


def mean_or_zero(values: Iterable[float]) -> float:
  values = list(values)
  return float(sum(values) / len(values)) if values else 0.0
