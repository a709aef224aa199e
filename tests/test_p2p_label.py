"""A p2p transfer's label (training/pipeline/p2p.py) reads as the f-string of its key would, for any key."""

from hypothesis import given, strategies as st

from simsp.training.pipeline.p2p import _label

fields = st.integers(-10**6, 10**6) | st.booleans() | st.text(max_size=4) | st.floats()


@given(st.sampled_from(["act", "grad", "it's"]), fields, fields, st.lists(fields, max_size=2))
def test_the_label_is_the_key_prefix_repr(kind, micro_batch, stage, rest):
    key = (kind, micro_batch, stage, *rest)
    assert _label(key) == f"p2p {key[:3]}"


def test_short_keys_keep_what_they_have():
    assert _label(("act", 3)) == "p2p ('act', 3)"
