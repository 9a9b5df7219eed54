"""The site's kept digits partition (datasets.digits.site_partition cache_dir): a damaged or
half-written cache file is never used, the split is computed again and the file replaced."""

from __future__ import annotations

import numpy as np

from cuvil_edge.datasets import digits


def test_the_cached_partition_is_the_computed_one(tmp_path):
    fresh = digits.site_partition(1, 3)
    first = digits.site_partition(1, 3, cache_dir=tmp_path)
    [cached] = tmp_path.glob("*.npz")
    again = digits.site_partition(1, 3, cache_dir=tmp_path)
    for split in (first, again):
        np.testing.assert_array_equal(split.x, fresh.x)
        np.testing.assert_array_equal(split.y, fresh.y)
    assert cached.stat().st_size > 0


def test_a_damaged_cache_file_is_recomputed_not_used(tmp_path):
    fresh = digits.site_partition(0, 3)
    digits.site_partition(0, 3, cache_dir=tmp_path)
    [cached] = tmp_path.glob("*.npz")
    for damage in (cached.read_bytes()[:100], b"not an npz", b""):  # torn write, garbage, empty
        cached.write_bytes(damage)
        got = digits.site_partition(0, 3, cache_dir=tmp_path)
        np.testing.assert_array_equal(got.y, fresh.y)
        np.testing.assert_array_equal(got.x, fresh.x)
        with np.load(cached, allow_pickle=False) as f:  # and the file is whole again
            np.testing.assert_array_equal(f["y"], fresh.y)


def test_another_partitions_file_is_not_taken(tmp_path):
    digits.site_partition(0, 3, cache_dir=tmp_path)
    other = digits.site_partition(1, 3, cache_dir=tmp_path)
    np.testing.assert_array_equal(other.y, digits.site_partition(1, 3).y)
    assert len(list(tmp_path.glob("*.npz"))) == 2
