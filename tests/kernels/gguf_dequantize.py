"""The gguf package's dequantization (the reference of quant_test.cpp).

Usage: gguf_dequantize.py TYPE_ID ROW_BYTES IN OUT [TYPE_ID ROW_BYTES IN OUT ...]
Each IN holds rows of ROW_BYTES bytes of ggml type TYPE_ID; OUT gets their values as
little-endian float32, row after row.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

args = sys.argv[1:]
assert len(args) % 4 == 0, __doc__
for i in range(0, len(args), 4):
    qtype = GGMLQuantizationType(int(args[i]))
    row_bytes = int(args[i + 1])
    data = np.fromfile(args[i + 2], dtype=np.uint8).reshape(-1, row_bytes)
    values = quants.dequantize(data, qtype).astype("<f4", copy=False)
    values.tofile(args[i + 3])
