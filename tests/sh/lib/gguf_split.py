#!/usr/bin/env python3
"""gguf_split.py IN.gguf OUTSTEM N: split a GGUF into N parts the way
llama.cpp's gguf-split lays them out (OUTSTEM-0000K-of-0000N.gguf; part 1
holds every key plus split.no / split.count / split.tensors.count, later
parts only the split.* keys; each part its own tensors, data aligned), for
tests of `cumulo pull` and `cumulo merge`. Written from the GGUF spec, in
Python, independently of cumulo's C reader and writer."""
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def skip_value(d, o, t):
    if t in SCALAR:
        return o + struct.calcsize("<" + SCALAR[t])
    if t == 8:
        (n,) = struct.unpack_from("<Q", d, o)
        return o + 8 + n
    if t == 9:
        at, n = struct.unpack_from("<IQ", d, o)
        o += 12
        for _ in range(n):
            o = skip_value(d, o, at)
        return o
    raise ValueError("bad type %d" % t)


def main():
    src, stem, nparts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    d = open(src, "rb").read()
    magic, version, nt, nkv = struct.unpack_from("<IIQQ", d, 0)
    assert magic == 0x46554747 and version == 3
    o = 24
    kv_start = o
    align = 32
    for _ in range(nkv):
        (kl,) = struct.unpack_from("<Q", d, o)
        key = d[o + 8:o + 8 + kl].decode()
        o += 8 + kl
        (t,) = struct.unpack_from("<I", d, o)
        o += 4
        if key == "general.alignment":
            (align,) = struct.unpack_from("<I", d, o)
        o = skip_value(d, o, t)
    kv_bytes = d[kv_start:o]
    tensors = []
    for _ in range(nt):
        (nl,) = struct.unpack_from("<Q", d, o)
        name = d[o + 8:o + 8 + nl]
        o += 8 + nl
        (nd,) = struct.unpack_from("<I", d, o)
        dims = struct.unpack_from("<%dQ" % nd, d, o + 4)
        o += 4 + 8 * nd
        typ, off = struct.unpack_from("<IQ", d, o)
        o += 12
        tensors.append([name, dims, typ, off])
    data0 = (o + align - 1) // align * align
    ends = sorted(t[3] for t in tensors) + [len(d) - data0]
    for t in tensors:  # a tensor's bytes reach to the next tensor's start (padding included)
        nxt = min(e for e in ends if e > t[3])
        t.append(d[data0 + t[3]:data0 + nxt])

    def kv(key, t, fmt, v):
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + struct.pack("<" + fmt, v)

    per = (len(tensors) + nparts - 1) // nparts
    for p in range(nparts):
        part = tensors[p * per:(p + 1) * per]
        split_kv = kv("split.no", 2, "H", p) + kv("split.count", 2, "H", nparts) + kv("split.tensors.count", 5, "i", len(tensors))
        body_kv = (kv_bytes if p == 0 else b"") + split_kv
        n_kv = (nkv if p == 0 else 0) + 3
        if p != 0 and align != 32:
            body_kv += kv("general.alignment", 4, "I", align)
            n_kv += 1
        hdr = struct.pack("<IIQQ", magic, 3, len(part), n_kv) + body_kv
        infos = b""
        off = 0
        blobs = []
        for name, dims, typ, _, blob in part:
            infos += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
            infos += struct.pack("<IQ", typ, off)
            pad = (len(blob) + align - 1) // align * align - len(blob)
            blobs.append(blob + b"\0" * pad)
            off += len(blob) + pad
        head = hdr + infos
        head += b"\0" * ((len(head) + align - 1) // align * align - len(head))
        with open("%s-%05d-of-%05d.gguf" % (stem, p + 1, nparts), "wb") as f:
            f.write(head)
            for b in blobs:
                f.write(b)


main()
