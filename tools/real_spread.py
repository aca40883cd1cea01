#!/usr/bin/env python3
"""tools/real_spread.py: how far one llama.cpp run (tools/llama_logits.c's
logits.bin per case, made by tools/real_spread.sh) is from the node-llama-cpp
reference of tests/data/real/MODEL.json, by the rule of
tests/sh/lib/real_check.py: equal greedy ids up to the first difference (and
llama.cpp's margin there), then the top-10 probability error per step up to
it (max and median). This is the noise floor a real model's test bounds must
sit above: another build of llama.cpp itself.

  real_spread.py REF.json DIR [FROM]   DIR/CASE/logits.bin for each case

FROM (default 0): the run was given the reference's first FROM greedy ids
after the prompt (teacher forcing: real_spread.sh AT=CASE:STEP), so its
logits' step k is the reference's step FROM + k.
"""
import heapq
import json
import math
import os
import struct
import sys


def main(ref_path, d, at=0):
    ref = json.load(open(ref_path))
    everr, full, meds = [], 0, []
    for c in ref["cases"]:
        if not os.path.isdir(os.path.join(d, c["name"])):
            continue  # not run (AT=CASE:STEP runs one case)
        p = os.path.join(d, c["name"], "logits.bin")
        if not os.path.exists(p):
            print(f"# {c['name']}: no logits")
            continue
        data = open(p, "rb").read()
        nv = len(data) // 4 // max(1, len(c["greedy"]) - at)
        n = min(len(data) // (4 * nv), len(c["greedy"]) - at)
        errs, first = [], None
        for k in range(n):
            lg = struct.unpack_from(f"<{nv}f", data, k * 4 * nv)
            m = max(lg)
            s = math.fsum(math.exp(x - m) for x in lg)
            mine = heapq.nlargest(10, range(nv), key=lg.__getitem__)
            pm = {i: math.exp(lg[i] - m) / s for i in mine}
            st = c["steps"][at + k]
            e = max(abs(math.exp(lg[t] - m) / s - q) for t, q in zip(st["ids"], st["p"]))
            for t in mine:
                if t not in st["ids"]:
                    e = max(e, pm[t] - st["p"][-1])
            errs.append(e)
            if mine[0] != c["greedy"][at + k]:
                first = at + k
                break
        eq = first if first is not None else at + n
        full += first is None
        med = sorted(errs)[len(errs) // 2]
        meds.append(med)
        everr += errs
        where = f", first difference at {first} (llama.cpp margin {c['margins'][first]:.4f})" if first is not None else ""
        print(f"# {c['name']}: {eq}/{len(c['greedy'])} ids equal{where}; probs max {max(errs):.2e} median {med:.2e}")
    everr.sort()
    print(f"# all: {full} prompts equal to the end; probs max {everr[-1]:.2e}, largest median per prompt {max(meds):.2e}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
