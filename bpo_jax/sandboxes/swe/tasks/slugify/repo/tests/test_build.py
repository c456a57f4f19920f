from toc import table_of_contents


def test_nested():
    doc = "# Intro\ntext\n## Install steps\n"
    assert table_of_contents(doc) == "- [Intro](#intro)\n  - [Install steps](#install-steps)"
