"""safetensors reader (single file or sharded via model.safetensors.index.json).

Written from the safetensors format description, independently of ppserve's C loader, so the
two implementations can check each other. Values come back as float64 so the reference model
computes on exactly the stored values with no further rounding.
"""

import json
import mmap
import os
import struct

import numpy as np

# safetensors dtype string -> numpy dtype of the stored element
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # decoded by widening to float32 bits
}


class SafetensorsError(Exception):
    """A safetensors checkpoint that is malformed or uses an unsupported dtype."""


class _File:
    """One .safetensors file: JSON header parsed eagerly, data read lazily from a mmap."""

    def __init__(self, path):
        self.path = path
        if os.path.getsize(path) < 8:
            raise SafetensorsError(f"{path}: too short for a safetensors header")
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (hlen,) = struct.unpack("<Q", self._map[:8])
        if 8 + hlen > len(self._map):
            raise SafetensorsError(f"{path}: header length {hlen} exceeds file size")
        try:
            header = json.loads(bytes(self._map[8:8 + hlen]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: bad JSON header: {e}") from None
        self.data_start = 8 + hlen
        self.metadata = header.pop("__metadata__", None)
        self.entries = header

    def get(self, name):
        e = self.entries[name]
        dtype_name = e.get("dtype")
        shape = tuple(int(s) for s in e.get("shape", []))
        begin, end = (int(x) for x in e.get("data_offsets", (0, 0)))
        dt = _DTYPES.get(dtype_name)
        if dt is None:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has unsupported dtype "
                                   f"{dtype_name!r}")
        n = int(np.prod(shape, dtype=np.int64))
        if end - begin != n * dt.itemsize:
            raise SafetensorsError(f"{self.path}: tensor {name!r}: data_offsets span "
                                   f"{end - begin} bytes, shape {list(shape)} of {dtype_name} "
                                   f"needs {n * dt.itemsize}")
        if self.data_start + end > len(self._map):
            raise SafetensorsError(f"{self.path}: tensor {name!r} runs past the end of the file")
        raw = np.frombuffer(self._map, dtype=dt, count=n, offset=self.data_start + begin)
        if dtype_name == "BF16":
            vals = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            vals = raw.astype(np.float64)
        return vals.reshape(shape)


class SafetensorsModel:
    """All tensors of an HF checkpoint directory (or a single .safetensors file), by name."""

    def __init__(self, path):
        self.path = path
        self._where = {}  # tensor name -> _File
        files = {}

        def open_file(fname):
            if fname not in files:
                if not os.path.isfile(fname):
                    raise SafetensorsError(f"missing safetensors file {fname}")
                files[fname] = _File(fname)
            return files[fname]

        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            single = os.path.join(path, "model.safetensors")
            if os.path.isfile(index):
                with open(index) as f:
                    weight_map = json.load(f).get("weight_map")
                if not isinstance(weight_map, dict):
                    raise SafetensorsError(f"{index}: no weight_map object")
                for name, fname in weight_map.items():
                    sf = open_file(os.path.join(path, fname))
                    if name not in sf.entries:
                        raise SafetensorsError(f"{index}: maps {name!r} to {fname}, "
                                               f"which does not contain it")
                    self._where[name] = sf
            elif os.path.isfile(single):
                sf = open_file(single)
                self._where = {name: sf for name in sf.entries}
            else:
                raise SafetensorsError(f"{path}: neither model.safetensors nor "
                                       f"model.safetensors.index.json found")
        else:
            sf = open_file(path)
            self._where = {name: sf for name in sf.entries}

    def names(self):
        return list(self._where)

    def has(self, name):
        return name in self._where

    def get(self, name):
        sf = self._where.get(name)
        if sf is None:
            raise SafetensorsError(f"{self.path}: missing tensor {name!r}")
        return sf.get(name)
