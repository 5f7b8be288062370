"""A small GGUF (version 3) writer and reader: metadata key/values of the types this project
writes, and F32/F16 tensors. Enough for the trained model; no third-party GGUF package needed.

Layout: magic "GGUF", version, tensor count, key/value count, the key/values, the tensor infos
(name, dims with the fastest-varying first, type, offset into the data section), padding to the
alignment, then the tensor data, each tensor aligned.
"""
import struct

import numpy as np

ALIGNMENT = 32

# Metadata value types.
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64 = 4, 5, 6, 7, 8, 9, 10
# Tensor types.
GGML_F32, GGML_F16 = 0, 1


def _string(s):
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


class GgufWriter:
    def __init__(self):
        self.kv = []  # (key, bytes of type + value)
        self.tensors = []  # (name, numpy array)

    def add_uint32(self, key, value):
        self.kv.append((key, struct.pack("<II", UINT32, value)))

    def add_int32(self, key, value):
        self.kv.append((key, struct.pack("<Ii", INT32, value)))

    def add_float32(self, key, value):
        self.kv.append((key, struct.pack("<If", FLOAT32, value)))

    def add_bool(self, key, value):
        self.kv.append((key, struct.pack("<I?", BOOL, value)))

    def add_string(self, key, value):
        self.kv.append((key, struct.pack("<I", STRING) + _string(value)))

    def add_string_array(self, key, values):
        body = b"".join(_string(v) for v in values)
        self.kv.append((key, struct.pack("<IIQ", ARRAY, STRING, len(values)) + body))

    def add_float32_array(self, key, values):
        body = np.asarray(values, dtype="<f4").tobytes()
        self.kv.append((key, struct.pack("<IIQ", ARRAY, FLOAT32, len(values)) + body))

    def add_int32_array(self, key, values):
        body = np.asarray(values, dtype="<i4").tobytes()
        self.kv.append((key, struct.pack("<IIQ", ARRAY, INT32, len(values)) + body))

    def add_tensor(self, name, array):
        """array: float32 or float16 numpy array in row-major [rows][cols] (ggml's ne = cols, rows)."""
        assert array.dtype in (np.float32, np.float16)
        self.tensors.append((name, np.ascontiguousarray(array)))

    def write(self, path):
        header = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        header += b"".join(_string(k) + v for k, v in self.kv)
        offset = 0
        infos, offsets = b"", []
        for name, array in self.tensors:
            dims = list(reversed(array.shape))
            ggml_type = GGML_F32 if array.dtype == np.float32 else GGML_F16
            infos += _string(name) + struct.pack("<I", len(dims))
            infos += b"".join(struct.pack("<Q", d) for d in dims)
            infos += struct.pack("<IQ", ggml_type, offset)
            offsets.append(offset)
            offset += array.nbytes
            offset += (-offset) % ALIGNMENT
        with open(path, "wb") as f:
            f.write(header + infos)
            f.write(b"\0" * ((-f.tell()) % ALIGNMENT))
            data_start = f.tell()
            for (name, array), off in zip(self.tensors, offsets):
                f.write(b"\0" * (data_start + off - f.tell()))
                f.write(array.astype(array.dtype.newbyteorder("<")).tobytes())


def read_gguf(path):
    """Returns (metadata dict, {name: numpy array}) for a GGUF this writer made (F32/F16 only)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
              11: "<q", 12: "<d"}

    def value(vtype):
        if vtype == STRING:
            return string()
        if vtype == ARRAY:
            etype, count = take("<IQ")
            return [value(etype) for _ in range(count)]
        return take(scalar[vtype])

    assert data[:4] == b"GGUF", f"{path} is not a GGUF file"
    pos = 4
    _, n_tensors, n_kv = take("<IQQ")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        n_dims = take("<I")
        dims = [take("<Q") for _ in range(n_dims)]
        ggml_type, offset = take("<IQ")
        infos.append((name, dims, ggml_type, offset))
    alignment = meta.get("general.alignment", ALIGNMENT)
    data_start = pos + (-pos) % alignment
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        dtype = np.float32 if ggml_type == GGML_F32 else np.float16
        count = int(np.prod(dims))
        array = np.frombuffer(data, dtype=dtype, count=count, offset=data_start + offset)
        tensors[name] = array.reshape(list(reversed(dims)))
    return meta, tensors
