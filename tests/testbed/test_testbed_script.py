"""experiments/testbed.py refuses bad input in one line, exit status 2, before any compute."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments import testbed  # noqa: E402


def test_bad_arguments(tmp_path, capsys):
  for argv, words in ((["--weights=0,1.5"], "--weights"), (["--methods=rloo,grpo"], "bpo"),
                      (["--checkpoints=40"], "--checkpoints"), (["--lrs=1,x"], "comma")):
    assert testbed.main([f"--out={tmp_path}"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
  assert os.listdir(tmp_path) == []


def test_files_of_other_settings_are_kept(tmp_path, capsys):
  d = tmp_path / "w0"
  d.mkdir()
  (d / "world.json").write_text(json.dumps(dict(settings=dict(seeds=3))))
  assert testbed.main([f"--out={tmp_path}", "--weights=0"]) == 2
  assert "other settings" in capsys.readouterr().err
  assert json.loads((d / "world.json").read_text()) == dict(settings=dict(seeds=3))
