#!/usr/bin/env python3
"""tests/sh/lib/real_tok.py: every text of tests/data/real/MODEL.tok.json
(llama.cpp's test-tokenizer-0 corpus, tokenized by llama.cpp with the real
model's vocabulary: tools/real_tok_refs.mjs) through `BIN tokenize MODEL -
--no-bos --json`; prints one FAIL line per text whose ids differ and a
summary. Used by tests/sh/real_models.sh; not a test itself.

  real_tok.py REF.tok.json BIN MODEL
"""
import json
import subprocess
import sys

ref_path, bin_, model = sys.argv[1:4]
ref = json.load(open(ref_path))
bad = 0
for i, c in enumerate(ref["cases"]):
    r = subprocess.run([bin_, "tokenize", model, "-", "--no-bos", "--json"], input=c["text"].encode(),
                       capture_output=True, timeout=120)
    try:
        got = json.loads(r.stdout)["ids"]
    except ValueError:
        got = None
    if got != c["ids"]:
        bad += 1
        print(f"FAIL: text {i} {json.dumps(c['text'])[:60]}: {str(got)[:80]} vs llama.cpp {str(c['ids'])[:80]}")
print(f"# {ref['model']}: {len(ref['cases']) - bad} of {len(ref['cases'])} texts tokenize as llama.cpp does")
sys.exit(1 if bad else 0)
