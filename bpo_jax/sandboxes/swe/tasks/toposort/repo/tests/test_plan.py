from depgraph import build_order


def test_only_needed():
    targets = {"app": ["lib"], "lib": ["base"], "docs": ["base"]}
    assert build_order(targets, only="lib") == ["base", "lib"]
