#!/usr/bin/env python3
"""Writes the fuzz seed corpus (tests/fuzz/corpus/*.safetensors): small valid files covering
every dtype, metadata, zero-size and unpadded layouts, and one file per kind of defect the
reader rejects. Built by hand (no safetensors package) so seeds may break the rules."""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def raw(header, data=b"", pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def layout(tensors, metadata=None):
    """tensors: (name, dtype, shape); returns a valid file with patterned data."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        size = n * BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    return header, bytes((i * 37 + 11) & 0xFF for i in range(off))


def main():
    os.makedirs(HERE, exist_ok=True)
    seeds = {}
    h, d = layout([(f"t.{k.lower()}", k, [2, 4]) for k in BITS], {"format": "pt"})
    seeds["valid_all_dtypes"] = raw(h, d)
    seeds["valid_empty"] = raw({})
    seeds["valid_metadata_only"] = raw({"__metadata__": {"a": "b", "c": ""}})
    h, d = layout([("w", "F32", [2, 3]), ("z", "BF16", [0, 4]), ("s", "I64", []), ("q", "F4", [3, 2])])
    seeds["valid_mixed"] = raw(h, d)
    seeds["valid_unpadded"] = raw(h, d, pad=False)
    h, d = layout([("a", "U8", [3]), ("b", "U16", [2])], None)
    h["__metadata__"] = None
    seeds["valid_null_metadata"] = raw(h, d)
    # Defects.
    good = raw(*layout([("a", "F32", [2]), ("b", "U8", [4])], {"k": "v"}))
    seeds["bad_truncated"] = good[:-3]
    seeds["bad_trailing"] = good + b"\0\0"
    seeds["bad_header_len"] = struct.pack("<Q", 1 << 40) + good[8:]
    seeds["bad_json"] = raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}', b"\0" * 4)
    seeds["bad_dtype"] = raw({"a": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    seeds["bad_size"] = raw({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    seeds["bad_overlap"] = raw({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6)
    seeds["bad_hole"] = raw({"a": {"dtype": "U8", "shape": [4], "data_offsets": [1, 5]}}, b"\0" * 5)
    seeds["bad_negative_dim"] = raw({"a": {"dtype": "U8", "shape": [-4], "data_offsets": [0, 4]}}, b"\0" * 4)
    seeds["bad_huge_dims"] = raw({"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 8],
                                        "data_offsets": [0, 8]}}, b"\0" * 8)
    seeds["bad_metadata_value"] = raw({"__metadata__": {"a": 1}})
    seeds["bad_duplicate"] = raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                 b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    for name, data in seeds.items():
        assert len(data) < 4096, name
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
