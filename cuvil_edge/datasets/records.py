"""The record type every data source gives a site: labelled records, one row each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Records:
    """A site's labelled records: ``x`` float32 ``[n, *record shape]``, ``y`` int64 class
    indices ``[n]``. The digits partition, the site's own files and the train/eval split all
    give one."""

    x: np.ndarray
    y: np.ndarray
