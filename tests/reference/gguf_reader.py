"""GGUF (v2/v3) reader for the numpy reference model.

Written from the GGUF specification alone, sharing nothing with ppserve's C loader, so that a
misreading of the format in one of them shows up as a disagreement instead of being shared.
Every tensor is dequantized to float64: the reference then adds no rounding of its own beyond
what the file itself stores, and any difference against the engine is the engine's.
"""

import mmap
import os
import struct

import numpy as np

GGUF_MAGIC = 0x46554747  # b"GGUF" read as a little-endian u32

# ggml tensor types this reader can dequantize. F64 is not used by real checkpoints but lets the
# selftest store values (rope_freqs) without float32 rounding.
GGML_F32 = 0
GGML_F16 = 1
GGML_Q8_0 = 8
GGML_F64 = 28
GGML_BF16 = 30
GGML_TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q8_0: "Q8_0",
                   GGML_F64: "F64", GGML_BF16: "BF16"}

Q8_0_BLOCK = 32          # values per block
Q8_0_BLOCK_BYTES = 34    # f16 scale + 32 int8

# Metadata value types: id -> struct format for the fixed-size scalars.
_SCALAR_FORMATS = {
    0: "<B",   # u8
    1: "<b",   # i8
    2: "<H",   # u16
    3: "<h",   # i16
    4: "<I",   # u32
    5: "<i",   # i32
    6: "<f",   # f32
    7: "<B",   # bool (one byte; nonzero is true)
    10: "<Q",  # u64
    11: "<q",  # i64
    12: "<d",  # f64
}
_TYPE_STRING = 8
_TYPE_ARRAY = 9
_TYPE_BOOL = 7


class GGUFError(Exception):
    """A GGUF file that is malformed or uses something this reader does not support."""


class _Cursor:
    """Sequential little-endian reads over the mapped file, with truncation checks."""

    def __init__(self, buf, path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n):
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(f"{self.path}: truncated file (need {n} bytes at offset {self.pos})")
        b = self.buf[self.pos:end]
        self.pos = end
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.unpack("<Q")
        # surrogateescape keeps token strings that are not valid UTF-8 lossless.
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype in _SCALAR_FORMATS:
            v = self.unpack(_SCALAR_FORMATS[vtype])
            return bool(v) if vtype == _TYPE_BOOL else v
        if vtype == _TYPE_STRING:
            return self.string()
        if vtype == _TYPE_ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALAR_FORMATS:
                # Bulk-decode numeric arrays: token score/type arrays can hold 150k entries.
                fmt = _SCALAR_FORMATS[etype]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.take(size * count), dtype=np.dtype(fmt))
                out = arr.tolist()
                return [bool(x) for x in out] if etype == _TYPE_BOOL else out
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at offset {self.pos}")


class TensorInfo:
    def __init__(self, name, dims, ggml_type, offset):
        self.name = name
        self.dims = dims                      # GGUF order: dims[0] varies fastest
        self.shape = tuple(reversed(dims))    # numpy (row-major) order
        self.ggml_type = ggml_type
        self.offset = offset                  # relative to the data section
        self.n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1

    def type_name(self):
        return GGML_TYPE_NAMES.get(self.ggml_type, f"ggml type {self.ggml_type}")


class Q8Values(np.ndarray):
    """The float64 values of a Q8_0 tensor, marked so that matmul() takes its activations in
    int8 as ppserve's CPU engine does. Views (transposes, slices, reshapes) keep the mark."""


def q8_act(x):
    """x as ppserve's Q8_0 matmul sees it (kernels/cpu/matmul_q8.h), as float64 values q * d:
    per 32-value block of the last axis, in float32, d = max|x| / 127 and q = rint(x * (1 / d))
    (half to even); a block with an inf or NaN gives NaN, one whose d is below the smallest
    normal float32 gives zeros."""
    x32 = np.asarray(x, dtype=np.float32)
    b = x32.reshape(-1, Q8_0_BLOCK)
    finite = np.all(np.isfinite(b), axis=1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(b), b, 0)).max(axis=1), 0)
    d = (amax.astype(np.float32) / np.float32(127)).astype(np.float32)
    ok = finite & (d >= np.finfo(np.float32).tiny)
    inv = (np.float32(1) / np.where(ok, d, np.float32(1))).astype(np.float32)
    q = np.rint((b * inv[:, None]).astype(np.float32)) * ok[:, None]
    scale = np.where(finite, np.where(ok, d, 0), np.nan).astype(np.float64)
    return (q.astype(np.float64) * scale[:, None]).reshape(x32.shape)


def matmul(x, w):
    """x @ w.T; a Q8_0 weight (Q8Values) takes x through q8_act first."""
    if isinstance(w, Q8Values):
        x = q8_act(x)
    return np.asarray(x, dtype=np.float64) @ np.asarray(w).T


class GGUFFile:
    """Parsed header of a GGUF file; tensor data is read lazily from a read-only mmap. With
    q8_activations, Q8_0 tensors come back as Q8Values."""

    def __init__(self, path, q8_activations=False):
        self.path = path
        self.q8_activations = q8_activations
        if os.path.getsize(path) < 24:
            raise GGUFError(f"{path}: too short for a GGUF header")
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._map, path)

        magic = cur.unpack("<I")
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (magic {magic:#010x})")
        self.version = cur.unpack("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {self.version}")
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")

        self.metadata = {}
        self.metadata_types = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            self.metadata[key] = cur.value(vtype)
            self.metadata_types[key] = vtype

        self.tensors = {}
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            dims = [cur.unpack("<Q") for _ in range(n_dims)]
            ggml_type = cur.unpack("<I")
            offset = cur.unpack("<Q")
            if name in self.tensors:
                raise GGUFError(f"{path}: duplicate tensor name {name!r}")
            self.tensors[name] = TensorInfo(name, dims, ggml_type, offset)

        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
            raise GGUFError(f"{path}: bad general.alignment {alignment!r}")
        self.alignment = alignment
        self.data_start = -(-cur.pos // alignment) * alignment

    def has(self, name):
        return name in self.tensors

    def get(self, name):
        """Tensor `name` as a float64 array in numpy shape order (GGUF dims reversed)."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: missing tensor {name!r}")
        n = info.n_elements
        t = info.ggml_type
        if t == GGML_F32:
            dtype, nbytes = np.dtype("<f4"), 4 * n
        elif t in (GGML_F16, GGML_BF16):
            dtype, nbytes = np.dtype("<f2" if t == GGML_F16 else "<u2"), 2 * n
        elif t == GGML_F64:
            dtype, nbytes = np.dtype("<f8"), 8 * n
        elif t == GGML_Q8_0:
            if info.dims and info.dims[0] % Q8_0_BLOCK != 0:
                raise GGUFError(f"{self.path}: tensor {name!r}: Q8_0 row length {info.dims[0]} "
                                f"is not a multiple of {Q8_0_BLOCK}")
            dtype = np.dtype([("d", "<f2"), ("q", "i1", (Q8_0_BLOCK,))])
            assert dtype.itemsize == Q8_0_BLOCK_BYTES
            nbytes = (n // Q8_0_BLOCK) * Q8_0_BLOCK_BYTES
        else:
            raise GGUFError(f"{self.path}: tensor {name!r} has unsupported dtype "
                            f"{info.type_name()}")

        start = self.data_start + info.offset
        if start + nbytes > len(self._map):
            raise GGUFError(f"{self.path}: tensor {name!r} data [{start}, {start + nbytes}) "
                            f"runs past the end of the file ({len(self._map)} bytes)")
        count = nbytes // dtype.itemsize
        raw = np.frombuffer(self._map, dtype=dtype, count=count, offset=start)

        if t == GGML_Q8_0:
            vals = raw["d"].astype(np.float64)[:, None] * raw["q"].astype(np.float64)
            if self.q8_activations:
                vals = vals.view(Q8Values)
        elif t == GGML_BF16:
            # bf16 is the upper half of an IEEE float32.
            vals = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            vals = raw.astype(np.float64)
        return vals.reshape(info.shape)
