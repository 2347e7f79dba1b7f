"""Bytes of each tensor of a GGUF file, read from its header (no tensor data is touched), so that
the decode bound counts exactly what a stage's layers hold. Only the header layout is needed: the
key/value section is skipped value by value, then each tensor's name, shape and type give its
size."""
import struct

# ggml type -> (bytes per block, elements per block); the types `ppserve synth` writes
GGML_TYPES = {0: (4, 1), 1: (2, 1), 8: (34, 32), 30: (2, 1)}  # f32, f16, q8_0, bf16

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt):
        fmt = "<" + fmt
        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))

    def string(self):
        (n,) = self.unpack("Q")
        return self.f.read(n).decode("utf-8", "replace")

    def skip_value(self, vtype):
        if vtype in _SCALARS:
            self.f.seek(struct.calcsize("<" + _SCALARS[vtype]), 1)
        elif vtype == 8:
            (n,) = self.unpack("Q")
            self.f.seek(n, 1)
        elif vtype == 9:
            etype, n = self.unpack("IQ")
            if etype in _SCALARS:
                self.f.seek(n * struct.calcsize("<" + _SCALARS[etype]), 1)
            else:
                for _ in range(n):
                    self.skip_value(etype)
        else:
            raise ValueError(f"GGUF value type {vtype} is not known")


def tensor_bytes(path):
    """{tensor name: bytes} of the GGUF file at path."""
    with open(path, "rb") as f:
        r = _Reader(f)
        magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (magic {magic!r})")
        (version,) = r.unpack("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = r.unpack("QQ")
        for _ in range(n_kv):
            r.string()
            (vtype,) = r.unpack("I")
            r.skip_value(vtype)
        out = {}
        for _ in range(n_tensors):
            name = r.string()
            (n_dims,) = r.unpack("I")
            dims = r.unpack("Q" * n_dims)
            ttype, _offset = r.unpack("IQ")
            if ttype not in GGML_TYPES:
                raise ValueError(f"{path}: tensor {name} has ggml type {ttype}, "
                                 "not one synth writes")
            n = 1
            for d in dims:
                n *= d
            block_bytes, block_elems = GGML_TYPES[ttype]
            out[name] = n // block_elems * block_bytes
        return out


def layer_bytes(sizes, layer):
    """Bytes of every tensor of one layer (blk.<layer>.*)."""
    prefix = f"blk.{layer}."
    return sum(b for name, b in sizes.items() if name.startswith(prefix))
