from toc import slugify


def test_spaces():
    assert slugify("  Getting   Started ") == "getting-started"
