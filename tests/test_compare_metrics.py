"""scripts/compare_metrics.py: the records of two runs compared key by key, times aside."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import compare_metrics  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def _write(directory, name, records):
  os.makedirs(directory / name, exist_ok=True)
  with open(directory / name / "metrics.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def test_times_aside_equal_records_are_equal_and_a_new_key_is_listed():
  before = [{"phase": "train", "iteration": 1, "loss": 0.5, "time/update": 1.0}]
  after = [{"phase": "train", "iteration": 1, "loss": 0.5, "time/update": 9.0, "steps": 3}]
  assert compare_metrics.compare_records(before, after) == ([], {"steps"})


def test_a_changed_value_and_a_missing_record_are_differences():
  before = [{"phase": "eval", "iteration": 0, "success_rate": 0.25},
            {"phase": "train", "iteration": 1, "loss": 0.5}]
  after = [{"phase": "eval", "iteration": 0, "success_rate": 0.5}]
  differences, one_sided = compare_metrics.compare_records(before, after)
  assert differences == ["2 records before, 1 after",
                         "record 0 (eval, iteration 0): success_rate 0.25 before, 0.5 after"]
  assert one_sided == set()


def test_directories_of_workdirs_and_the_exit_status(tmp_path, capsys):
  record = {"phase": "train", "iteration": 1, "loss": 0.5}
  _write(tmp_path / "a", "wd_rooms", [record])
  _write(tmp_path / "b", "wd_rooms", [{**record, "time/rollout": 2.0}])
  assert compare_metrics.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
  assert "wd_rooms: 1 records, equal" in capsys.readouterr().out
  _write(tmp_path / "b", "wd_rooms", [{**record, "loss": 0.25, "new": 1}])
  assert compare_metrics.main([str(tmp_path / "a" / "wd_rooms"),
                               str(tmp_path / "b" / "wd_rooms")]) == 1
  out = capsys.readouterr().out
  assert "1 differences; keys in one run only: new" in out and "loss 0.5 before, 0.25 after" in out
  assert compare_metrics.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1
  assert compare_metrics.main([str(tmp_path / "none"), str(tmp_path / "b")]) == 2
