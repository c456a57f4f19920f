from depgraph import toposort


def test_chain():
    assert toposort({"c": ["b"], "b": ["a"]}) == ["a", "b", "c"]


def test_ties_by_name():
    assert toposort({"z": [], "y": [], "x": ["z", "y"]}) == ["y", "z", "x"]
