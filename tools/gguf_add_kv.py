#!/usr/bin/env python3
"""gguf_add_kv.py IN.gguf OUT.gguf KEY u32 VALUE: copy a GGUF (v2/v3) with one
more u32 key-value (e.g. qwen2.pooling_type), the tensor data unchanged and
re-aligned after the longer header. For tests (tests/sh/http_embed.sh) and
tools/gen_embed_refs.sh: a model that declares its pooling. Standard library
only; refuses a key that is already there."""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, dst, key, typ, val = sys.argv[1:6]
    if typ != "u32":
        sys.exit("gguf_add_kv: only u32 values")
    b = open(src, "rb").read()
    if b[:4] != b"GGUF":
        sys.exit("gguf_add_kv: '%s' is not a GGUF file" % src)
    ver, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    p = 24
    align = 32

    def string(p):
        (n,) = struct.unpack_from("<Q", b, p)
        return b[p + 8:p + 8 + n].decode("utf-8", "replace"), p + 8 + n

    def value(t, p):
        if t == 8:
            return string(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                _, p = value(et, p)
            return None, p
        v = struct.unpack_from({0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                                11: "<q", 12: "<d"}[t], b, p)[0]
        return v, p + SIZES[t]

    kv0 = p
    for _ in range(n_kv):
        k, p = string(p)
        (t,) = struct.unpack_from("<I", b, p)
        v, p = value(t, p + 4)
        if k == key:
            sys.exit("gguf_add_kv: '%s' already has '%s'" % (src, key))
        if k == "general.alignment":
            align = v
    kv1 = p
    for _ in range(n_t):
        _, p = string(p)
        (nd,) = struct.unpack_from("<I", b, p)
        p += 4 + 8 * nd + 4 + 8
    ti1 = p
    data = (ti1 + align - 1) // align * align
    kb = key.encode()
    new = struct.pack("<Q", len(kb)) + kb + struct.pack("<II", 4, int(val))
    head = b"GGUF" + struct.pack("<IQQ", ver, n_t, n_kv + 1) + b[kv0:kv1] + new + b[kv1:ti1]
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(b[data:])


main()
