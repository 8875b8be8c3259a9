"""Content keys of pages: one per whole page, naming the whole prefix up to it."""

from cacheruntime.control.pagekeys import page_keys


def test_a_key_names_the_prefix_up_to_its_page():
    keys = page_keys((1, 2, 3, 4, 5, 6, 7), 2)
    assert len(keys) == 3 and len(set(keys)) == 3  # the partial last page has none
    assert page_keys((1, 2, 3, 4), 2) == keys[:2]  # the same prefix, the same keys
    other = page_keys((9, 2, 3, 4, 5, 6), 2)
    assert not set(other) & set(keys)  # an earlier page differs: every later key differs
    assert page_keys((3, 4), 2)[0] != keys[1]  # a page's key depends on what precedes it
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
    assert page_keys((12, 3), 2) != page_keys((1, 23), 2)  # token boundaries are kept
