#!/usr/bin/env python3
"""Reference dequantizations of GGML's 5-bit, K-quant and IQ4 blocks, from the `gguf`
Python package (an implementation independent of dcpserve's), for the Rust test
`cpu::kquants::tests::blocks_match_the_gguf_package`.

For each type it writes a few blocks of random-but-valid bytes (f16 scales finite, of
sane magnitude) to fixtures/gguf_quants/<TYPE>.blocks and the gguf package's values as
little-endian f32 to fixtures/gguf_quants/<TYPE>.f32. Q8_K is missing: gguf 0.19.0
does not dequantize it (its layout, `d: f32` + 256 × i8 + 16 block sums, is checked by
a hand-built block in the Rust test instead).

    python3 -m venv /tmp/ggufvenv && /tmp/ggufvenv/bin/pip install gguf==0.19.0 numpy
    /tmp/ggufvenv/bin/python scripts/make_gguf_quant_fixtures.py
"""

import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "gguf_quants"

# type -> (block bytes, byte offsets of its f16 scale fields)
LAYOUTS = {
    T.Q5_0: (22, [0]),
    T.Q5_1: (24, [0, 2]),
    T.Q2_K: (84, [80, 82]),
    T.Q3_K: (110, [108]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),

    T.IQ4_NL: (18, [0]),
    T.IQ4_XS: (136, [0]),
}
BLOCKS = 4


def scale(rng):
    """A random f16 scale of either sign and magnitude 1e-3 .. 1e-1."""
    mag = 10 ** rng.uniform(-3, -1)
    return np.float16(mag * rng.choice([-1.0, 1.0]))


def make_blocks(rng, qtype):
    size, f16_fields = LAYOUTS[qtype]
    blocks = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for b in blocks:
        for off in f16_fields:
            b[off : off + 2] = np.frombuffer(scale(rng).tobytes(), dtype=np.uint8)
    return blocks


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261201)
    for qtype in LAYOUTS:
        blocks = make_blocks(rng, qtype)
        values = dequantize(blocks.reshape(-1), qtype).astype("<f4").reshape(-1)
        assert np.all(np.isfinite(values)), qtype.name
        (OUT / f"{qtype.name}.blocks").write_bytes(blocks.tobytes())
        (OUT / f"{qtype.name}.f32").write_bytes(values.tobytes())
        print(f"{qtype.name}: {BLOCKS} blocks, {values.size} values, max |v| {np.abs(values).max():.4g}")


if __name__ == "__main__":
    main()
