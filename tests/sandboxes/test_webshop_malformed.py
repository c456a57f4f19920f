"""WebShop's released files, malformed: each missing or broken file or record is one line that
names the file and the record (a `TaskInputError`, exit status 2 from experiments/run.py), and
`--config.env.options.data_dir=D` selects the files from the command line."""

import json
import os
import re
import shutil
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from bpo_jax.sandboxes.base import TaskInputError
from bpo_jax.sandboxes.webshop import make_tasks, shop
from bpo_jax.testing.webshop_files import write_released_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RELEASED_CONFIG = os.path.join(ROOT, "experiments", "configs", "webshop_qwen2_5.py")
PRODUCTS, ATTRIBUTES, HUMAN = "items_shuffle.json", "items_ins_v2.json", "items_human_ins.json"
# write_released_files: product i has asin B00000000i, except 3 ("nan"), 5 (too long) and 8 (a
# repeat of 7), which the loader drops.
ASIN0, ASIN4 = "B000000000", "B000000004"


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("webshop_good")
  write_released_files(directory, 12, seed=1)
  return directory


def _copy(good_dir, tmp_path):
  data = tmp_path / "data"
  shutil.copytree(good_dir, data)
  return data


def _edit(path, change):
  """Rewrites the JSON file at `path` after `change(parsed)` has changed it in place."""
  with open(path, encoding="utf-8") as f:
    value = json.load(f)
  change(value)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f)


def _load(data, tmp_path):
  return make_tasks("test", None, data_dir=str(data), data_size="full",
                    index_cache_dir=str(tmp_path / "index"))


def _product(i, change):
  return lambda products: change(products[i])


def _set(key, value):
  return lambda record: record.__setitem__(key, value)


def _delete(key):
  return lambda record: record.pop(key)


# (file, change, what the line says after the file's path); `{p}` is the file's path.
RECORD_CASES = {
    "options a list": (PRODUCTS, _product(4, _set("customization_options", [
        {"value": "Red"}])), f"product 4 (asin '{ASIN4}'): customization_options must be a "
                             "JSON object (option name -> list of {\"value\": ...} entries), "
                             "got a list"),
    "option entry without value": (PRODUCTS, _product(0, lambda p: p[
        "customization_options"]["Color"][1].pop("value")),
        f"product 0 (asin '{ASIN0}'), customization option 'Color' entry 1: has no 'value' "
        "field"),
    "option entry a string": (PRODUCTS, _product(0, lambda p: p["customization_options"][
        "Size"].__setitem__(0, "Large")),
        f"product 0 (asin '{ASIN0}'), customization option 'Size' entry 0: must be a JSON "
        "object, got a string"),
    "option values an object": (PRODUCTS, _product(0, lambda p: p["customization_options"]
                                                   .__setitem__("Size", {"value": "Large"})),
                                f"product 0 (asin '{ASIN0}'), customization option 'Size': "
                                "must be a list of {\"value\": ...} entries, got an object"),
    "no name": (PRODUCTS, _product(4, _delete("name")),
                f"product 4 (asin '{ASIN4}'): has no 'name' field"),
    "asin a number": (PRODUCTS, _product(2, _set("asin", 17)),
                      "product 2: asin must be a string, got a number"),
    "product a list": (PRODUCTS, lambda products: products.__setitem__(6, ["B000000006"]),
                       "product 6: must be a JSON object, got a list"),
    "unreadable price": (PRODUCTS, _product(1, _set("pricing", "$abc")),
                         "product 1 (asin 'B000000001'): cannot read a price from '$abc'"),
    "bullet points an object": (PRODUCTS, _product(1, _set("small_description", {"a": 1})),
                                "product 1 (asin 'B000000001'): small_description must be a "
                                "list of strings, got an object"),
    "instructions a string": (HUMAN, lambda h: h.__setitem__(ASIN0, "i want a red mug"),
                              f"asin '{ASIN0}': must be a JSON list of instructions, got a "
                              "string"),
    "instruction without attributes": (HUMAN, lambda h: h[ASIN4][0].pop(
        "instruction_attributes"), f"asin '{ASIN4}', instruction 0: has no "
                                   "'instruction_attributes' field"),
    "instruction a number": (HUMAN, lambda h: h[ASIN4][0].__setitem__("instruction", 3),
                             f"asin '{ASIN4}', instruction 0: instruction must be a string, "
                             "got a number"),
    "instruction options of numbers": (HUMAN, lambda h: h[ASIN0][0].__setitem__(
        "instruction_options", {"color": 1}), f"asin '{ASIN0}', instruction 0: "
                                              "instruction_options[0] must be a string, got "
                                              "a number"),
    "attributes record a list": (ATTRIBUTES, lambda a: a.__setitem__(ASIN0, ["bpa free"]),
                                 f"asin '{ASIN0}': must be a JSON object, got a list"),
    "attributes a string": (ATTRIBUTES, lambda a: a[ASIN4].__setitem__(
        "attributes", "bpa free"), f"asin '{ASIN4}': attributes must be a list of strings, got "
                                   "a string"),
}


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_malformed_record_is_one_line_naming_file_and_record(good_dir, tmp_path, case):
  name, change, expected = RECORD_CASES[case]
  data = _copy(good_dir, tmp_path)
  _edit(data / name, change)
  what = {PRODUCTS: "products", ATTRIBUTES: "attributes", HUMAN: "human instructions"}[name]
  with pytest.raises(TaskInputError) as raised:
    _load(data, tmp_path)
  message = str(raised.value)
  assert message == f"WebShop {what} file {str(data / name)!r}, {expected}"


def _truncate_in_product(data, i):
  """Cuts the products file in the middle of product `i`'s record."""
  text = (data / PRODUCTS).read_text(encoding="utf-8")
  start = text.index(json.dumps(f"B{i:09d}"))
  (data / PRODUCTS).write_text(text[:start + 5], encoding="utf-8")


def test_malformed_files_are_one_line_naming_the_file(good_dir, tmp_path):
  data = _copy(good_dir, tmp_path)
  _load(data, tmp_path)  # the copy itself is good
  cases = []

  def case(setup, pattern):
    cases.append((setup, pattern))

  p = re.escape(repr(str(data / PRODUCTS)))
  h = re.escape(repr(str(data / HUMAN)))
  case(lambda: os.remove(data / HUMAN),
       f"WebShop data file {h} \\(human_instructions_path\\): No such file or directory$")
  case(lambda: (os.remove(data / HUMAN), (data / HUMAN).mkdir()),
       f"WebShop human instructions file {h}: Is a directory$")
  case(lambda: _truncate_in_product(data, 4),
       f"WebShop products file {p} is not valid JSON: Unterminated string .* "
       "\\(in element 4, character \\d+ of the file\\)$")
  case(lambda: (data / PRODUCTS).write_text('{"asin": "B1"}'),
       f"WebShop products file {p} is not valid JSON: expected one of \\['\\['\\], found '{{' "
       "\\(in the top level, character 0 of the file\\)$")
  case(lambda: (data / PRODUCTS).write_text(""),
       f"WebShop products file {p} is not valid JSON: expected one of \\['\\['\\], found the "
       "end of the file")
  case(lambda: (data / PRODUCTS).write_text((good_dir / PRODUCTS).read_text() + "]"),
       f"WebShop products file {p} is not valid JSON: text after the top-level value "
       "\\(in the end of the file")
  case(lambda: (data / HUMAN).write_bytes(
      (good_dir / HUMAN).read_bytes().replace(b"i want", b"i w\xffnt", 1)),
       f"WebShop human instructions file {h} is not valid JSON: not UTF-8")
  case(lambda: (data / HUMAN).write_text('{"B000000000": [], 7: []}'),
       f"WebShop human instructions file {h} is not valid JSON: expected a string key "
       "\\(in the member after 'B000000000', character 19 of the file\\)$")
  case(lambda: (data / PRODUCTS).write_text("[]"),
       f"WebShop products file {p}: no usable products$")
  for setup, pattern in cases:
    shutil.rmtree(data)
    shutil.copytree(good_dir, data)
    setup()
    with pytest.raises(TaskInputError) as raised:
      _load(data, tmp_path)
    assert re.match(pattern, str(raised.value)), (pattern, str(raised.value))
    assert "\n" not in str(raised.value)
  with pytest.raises(TaskInputError, match=r"^env.options.data_dir = '.*/nowhere': no such "
                                           "directory"):
    _load(tmp_path / "nowhere", tmp_path)
  # The optional reviews file: a record's reviews must be a list of {"review": ...} objects.
  shutil.rmtree(data)
  shutil.copytree(good_dir, data)
  reviews = tmp_path / "reviews.json"
  for record, expected in (
      ({"asin": ASIN4, "reviews": "great"}, "record 1: reviews must be a list, got a string"),
      ({"asin": ASIN4, "reviews": [{"review": 5}]},
       f"record 1 (asin '{ASIN4}'), review 0: review must be a string, got a number")):
    reviews.write_text(json.dumps([{"asin": ASIN0, "reviews": []}, record]))
    with pytest.raises(TaskInputError) as raised:
      make_tasks("test", None, data_dir=str(data), data_size="full", reviews_path=str(reviews),
                 index_cache_dir=str(tmp_path / "index"))
    assert str(raised.value) == f"WebShop reviews file {str(reviews)!r}, {expected}"


def test_unusable_index_cache_is_one_line(good_dir, tmp_path, monkeypatch):
  # A fresh process each time: the shop (and its index) is built again, not taken from the
  # shops this process already built from the same files.
  monkeypatch.setattr(shop, "_by_config", {})
  monkeypatch.setattr(shop, "_by_fingerprint", {})
  (tmp_path / "a_file").write_text("")
  with pytest.raises(TaskInputError, match=r"^env.options.index_cache_dir: cannot create the "
                                           r"WebShop index cache directory '.*a_file': File "
                                           r"exists$"):
    make_tasks("test", None, data_dir=str(good_dir), data_size="full",
               index_cache_dir=str(tmp_path / "a_file"))
  cache = tmp_path / "cache"
  _load(good_dir, tmp_path / "fresh")  # another process's cache, then damaged
  shutil.copytree(tmp_path / "fresh" / "index", cache)
  [index] = [p for p in cache.iterdir() if p.is_dir()]
  (index / "meta.json").write_text("{")
  monkeypatch.setattr(shop, "_by_config", {})
  monkeypatch.setattr(shop, "_by_fingerprint", {})
  with pytest.raises(TaskInputError, match=r"^WebShop index cache: not a saved WebShop index: "
                                           r"'.*bm25-.*'.*; remove that directory to rebuild"):
    make_tasks("test", None, data_dir=str(good_dir), data_size="full", index_cache_dir=str(cache))


def test_data_dir_from_the_command_line(good_dir, tmp_path):
  """The released config's `data_dir` placeholder takes a path from the command line and
  gives the tasks of those files."""
  argv = ["run.py", f"--config={RELEASED_CONFIG}", f"--config.env.options.data_dir={good_dir}",
          f"--config.env.options.index_cache_dir={tmp_path / 'index'}"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  options = dict(values.config.env.options)
  assert options["data_dir"] == str(good_dir)
  tasks = make_tasks("test", None, **options)
  assert tasks == _load(good_dir, tmp_path) and len(tasks) > 0


@pytest.mark.slow
def test_run_exits_2_with_one_line(good_dir, tmp_path):
  """experiments/run.py with a malformed file and with a missing directory: exit 2, one line on
  stderr, no traceback, no workdir left behind."""
  data = _copy(good_dir, tmp_path)
  _edit(data / PRODUCTS, _product(4, _set("customization_options", ["Red", "Blue"])))
  for data_dir, expected in (
      (data, f"error: WebShop products file {str(data / PRODUCTS)!r}, product 4 (asin "
             f"'{ASIN4}'): customization_options must be a JSON object"),
      (tmp_path / "nowhere", f"error: env.options.data_dir = {str(tmp_path / 'nowhere')!r}: "
                             "no such directory")):
    workdir = tmp_path / "workdir"
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
         f"--config={RELEASED_CONFIG}", f"--workdir={workdir}",
         f"--config.env.options.data_dir={data_dir}",
         f"--config.env.options.index_cache_dir={tmp_path / 'index'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert not workdir.exists()
