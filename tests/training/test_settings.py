"""The typed settings: the schema's sections, names and defaults, read from the configuration in
one place (docs/DESIGN.md §2)."""

import ast
import dataclasses
import glob
import importlib
import os

import pytest

from bpo_jax import rollout
from bpo_jax.training import config as config_lib
from bpo_jax.training import settings as settings_lib
from bpo_jax.training import translate
from bpo_jax.training import update

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# What may read the `ml_collections` configuration itself: the schema and its checks, the
# translation into `Settings`, and the dry run's command line (an entry point, like
# experiments/*.py and the Colab notebook, which are outside the package).
READS_THE_CONFIGURATION = ("bpo_jax/training/config.py", "bpo_jax/training/bounds.py",
                           "bpo_jax/training/settings.py", "bpo_jax/training/dry_run.py")
SECTIONS = tuple(config_lib.to_plain(config_lib.default_config()))


def _config_files():
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py"))):
    name = os.path.basename(path)[:-3]
    if name not in ("__init__", "base"):
      yield name


@pytest.mark.parametrize("name", list(_config_files()))
def test_settings_hold_every_key_of_every_config_file(name):
  module = importlib.import_module(f"experiments.configs.{name}")
  for config in (module.get_config(), module.get_config("tiny")):
    settings = settings_lib.from_config(config)
    assert settings.to_plain() == config_lib.to_plain(config)
    assert settings.rollout.k == config.rollout.k
    assert settings.scale.mesh.fsdp == config.scale.mesh.fsdp


def test_settings_are_frozen_and_plain():
  settings = settings_lib.from_config(config_lib.default_config())
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.rollout.k = 3
  assert isinstance(settings.env.options, dict) and settings.env.options == {"difficulty": 1}
  assert type(settings.scale.distributed) is settings_lib.DistributedSettings
  assert {f.name for f in dataclasses.fields(settings_lib.Settings)} == set(SECTIONS)


def test_a_setting_has_the_schema_s_name_and_default_in_the_typed_configs():
  """`RolloutConfig()` and `UpdateConfig()` default to what the schema's defaults translate to,
  field by field, under the same names."""
  settings = settings_lib.from_config(config_lib.default_config())
  for made, default in ((translate.rollout_config(settings), rollout.RolloutConfig()),
                        (translate.update_config(settings), update.UpdateConfig())):
    assert dataclasses.asdict(made) == dataclasses.asdict(default)
  r, t = settings.rollout, settings.train
  made = translate.rollout_config(settings)
  assert (made.k, made.root_k, made.fork_probability, made.max_tree_tokens,
          made.max_action_tokens) == (r.k, r.root_k, r.fork_probability, r.max_tree_tokens,
                                      r.max_action_tokens) == (2, 0, 0.3, 1024, 5)
  assert update.UpdateConfig().normalization == t.normalization == "tree"
  assert update.UpdateConfig().micro_batches == t.micro_batches == 2
  assert update.OptimizerConfig().learning_rate == t.learning_rate


def _raw_config_uses(path: str) -> list[str]:
  """`ml_collections` imports and walks of a configuration (`config.<section>`, also
  `exp.config.<section>`) in the module at `path`, as "line: what"."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [f"{node.lineno}: import {a.name}" for a in node.names
                if a.name.split(".")[0] == "ml_collections"]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ml_collections"):
      found.append(f"{node.lineno}: from {node.module} import ...")
    elif isinstance(node, ast.Attribute) and node.attr in SECTIONS:
      base = node.value
      name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
      if name in ("config", "cfg"):
        found.append(f"{node.lineno}: {name}.{node.attr}")
  return found


@pytest.mark.slow
def test_the_raw_configuration_is_read_by_the_schema_and_the_translation_alone():
  paths = sorted(glob.glob(os.path.join(ROOT, "bpo_jax", "**", "*.py"), recursive=True))
  assert len(paths) > 50
  offenders = {}
  for path in paths:
    relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
    if relative not in READS_THE_CONFIGURATION:
      uses = _raw_config_uses(path)
      if uses:
        offenders[relative] = uses
  assert not offenders


def test_the_scan_finds_a_walk_of_the_configuration(tmp_path):
  """The scan above is not vacuous: it sees each kind of use."""
  module = tmp_path / "walks.py"
  module.write_text("import ml_collections\nfrom ml_collections import config_flags\n"
                    "def f(config, exp):\n  return config.rollout.k + exp.config.seed\n")
  assert sorted(_raw_config_uses(str(module))) == [
      "1: import ml_collections", "2: from ml_collections import ...", "4: config.rollout",
      "4: config.seed"]
