"""Each setting of experiments/configs/ gives the configuration it gave before the files were
one per setting, key by key.

tests/fixtures/experiment_configs.json holds, for every config file and argument of the tree at
commit f2843a8 (`rooms_<estimator>.py` with `:tiny` and `:d2`, `alfworld.py:cpu`, ...), its
plain configuration (`config_lib.to_plain`) as it was ("as_is") and after each registered
estimator as compare.py applies it (`base.with_estimator`), written as the keys that differ from
that commit's `default_config()` (also in the fixture) and the keys it lacks. BPO over a
baseline's file (group size 0, which BPO does not read) has no file of its own any more and is
not recorded.
"""

import importlib
import json
import os
import re

import ml_collections
import pytest

from bpo_jax.training import config as config_lib
from experiments.configs import base

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "experiment_configs.json")
with open(FIXTURE, encoding="utf-8") as _f:
  OLD = json.load(_f)

# Settings whose file or argument was renamed; the estimator files map to one file each.
RENAMED = {"alfworld.py:cpu": "alfworld_cpu.py", "webshop.py:cpu": "webshop_cpu.py"}
for _e in ("bpo", "grpo", "rloo", "gigpo"):
  RENAMED.update({f"rooms_{_e}.py": "rooms.py", f"rooms_{_e}.py:tiny": "rooms.py:tiny",
                  f"rooms_{_e}.py:d2": "rooms_d2.py",
                  f"textworld_{_e}.py": "textworld.py",
                  f"textworld_{_e}.py:tiny": "textworld.py:tiny",
                  f"textworld_{_e}.py:cpu": "textworld_cpu.py"})


ESTIMATOR_FILE = re.compile(r"^(?:rooms|textworld)_(bpo|grpo|rloo|gigpo)\.py")


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def _old(entry: dict) -> dict:
  """The flat plain configuration a fixture entry records."""
  config = {k: v for k, v in OLD["default"].items() if k not in entry["removed"]}
  config.update(entry["set"])
  return config


def _new(spec: str, estimator: str | None) -> dict:
  """The flat plain configuration of `spec` (FILE[:ARG]) with `estimator` as compare.py sets it."""
  name, _, arg = spec.partition(":")
  module = importlib.import_module(f"experiments.configs.{name[:-3]}")
  config = module.get_config(arg) if arg else module.get_config()
  config = ml_collections.ConfigDict(config_lib.to_plain(config))
  if estimator is not None:
    config = base.with_estimator(config, estimator)
  return _flat(json.loads(json.dumps(config_lib.to_plain(config))))


def _cases():
  for old_spec, entries in sorted(OLD["configs"].items()):
    own = ESTIMATOR_FILE.match(old_spec)
    for key in sorted(entries):
      # An estimator's own file as it was is that estimator over the one file of the setting.
      estimator = {"as_is": own and own.group(1)}.get(key, key)
      yield pytest.param(old_spec, key, RENAMED.get(old_spec, old_spec), estimator,
                         id=f"{old_spec}-{key}")


@pytest.mark.parametrize("old_spec,key,new_spec,estimator", list(_cases()))
def test_setting_gives_the_configuration_it_gave(old_spec, key, new_spec, estimator):
  old = _old(OLD["configs"][old_spec][key])
  new = _new(new_spec, estimator)
  # Keys added to the schema since, at their defaults, change nothing (as compare.py judges a
  # saved run's settings, `config_lib.saved_differences`); any other difference fails.
  differences = config_lib.saved_differences(old, new)
  assert not differences, f"{new_spec} with {estimator}: {differences}"


def test_the_fixture_covers_every_old_setting():
  """The renamed settings (estimator files, `:d2`, `:cpu`) and the files kept, 48 in all."""
  assert len(OLD["configs"]) == 48
  assert set(RENAMED) <= set(OLD["configs"])
  assert {"quickstart.py", "quickstart.py:tiny", "rooms_bpo.py:d2"} <= set(OLD["configs"])
  assert OLD["configs"]["rooms_grpo.py:d2"]["as_is"]["set"]["rollout.group_size"] == 0
