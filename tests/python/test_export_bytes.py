"""The byte-identity guard: every export, conversion and dequantization of export_bytes.py writes
exactly the files export_hashes.json pins (sha256 of each file), so that a refactoring of the
converter changes no output byte. After a change meant to alter output bytes, regenerate the
manifest with `python tests/python/export_bytes.py --write` and say why in the commit."""

import json

import pytest

from ckpt_support import skip_without_cli

skip_without_cli()

import export_bytes  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with open(export_bytes.MANIFEST) as f:
        pinned = json.load(f)
    return pinned, export_bytes.collect(str(tmp_path_factory.mktemp("export_bytes")))


def test_the_generated_sources_are_the_pinned_ones(runs):
    pinned, got = runs
    changed = sorted(k for k in pinned["inputs"].keys() | got["inputs"].keys()
                     if pinned["inputs"].get(k) != got["inputs"].get(k))
    assert not changed, f"the sources the guard builds changed (numpy, the fixtures or a builder): {changed}"


def test_every_output_byte_is_unchanged(runs):
    pinned, got = runs
    want, have = pinned["outputs"], got["outputs"]
    missing = sorted(want.keys() - have.keys())
    extra = sorted(have.keys() - want.keys())
    assert not missing and not extra, f"runs missing {missing}, runs not pinned {extra}"
    changed = []
    for run in sorted(want):
        for f in sorted(want[run].keys() | have[run].keys()):
            if want[run].get(f) != have[run].get(f):
                changed.append(f"{run}: {f} {want[run].get(f, 'absent')} -> {have[run].get(f, 'absent')}")
    assert not changed, f"{len(changed)} outputs changed:\n" + "\n".join(changed[:40])
