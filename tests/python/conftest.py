"""Shared helpers for the microscale Python tests."""

import os
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # spec_oracle

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]


def dtype_id(dt):
    return np.dtype(dt).name


def same_bits(a, b):
    """Bitwise equality of two arrays of the same dtype (NaN payloads included)."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.dtype.itemsize == 1:
        return np.array_equal(a.view(np.uint8), b.view(np.uint8))
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(a.view(view), b.view(view))


def assert_same_bits(got, want, what="", any_nan=True):
    """Bitwise equality; with any_nan (default) NaN matches NaN whatever its sign and payload
    (FORMATS.md pins no NaN bits for float outputs), only positions must agree."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if any_nan and (got.dtype.kind == "f" or got.dtype == BF16):
        gn = np.isnan(got.astype(np.float32))
        wn = np.isnan(want.astype(np.float32))
        if not np.array_equal(gn, wn):
            bad = np.flatnonzero((gn != wn).reshape(-1))
            raise AssertionError(f"{what}: NaN positions differ at flat {bad[:5].tolist()}: got "
                                 f"{got.reshape(-1)[bad[:5]]} want {want.reshape(-1)[bad[:5]]}")
        got = np.where(gn, np.zeros((), got.dtype), got)
        want = np.where(wn, np.zeros((), want.dtype), want)
    if not same_bits(got, want):
        view = {1: np.uint8, 2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
        g = got.view(view).reshape(-1)
        w = want.view(view).reshape(-1)
        bad = np.flatnonzero(g != w)
        idx = [np.unravel_index(i, got.shape) for i in bad[:5]]
        raise AssertionError(
            f"{what}: {bad.size} of {g.size} differ; first at {idx}: got "
            f"{[hex(int(v)) for v in g[bad[:5]]]} want {[hex(int(v)) for v in w[bad[:5]]]}")


@pytest.fixture
def rng(request):
    # A per-test deterministic seed so failures reproduce.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
