#!/usr/bin/env python3
"""tok_sweep.py: compare `cumulo tokenize` with llama.cpp (tools/tok_sweep.mjs)
on odd texts (whitespace runs, unicode, digits, emoji, apostrophes) for every
vocabulary given. Run by hand (needs node-llama-cpp, ../shared/oracle/README.md):

    python3 tools/tok_sweep.py ORACLE_DIR VOCAB.gguf... 

Prints each disagreement (text, llama.cpp's ids, ours); exit status 1 if any."""
import json, os, shutil, subprocess, sys, tempfile

TEXTS = [
    "", " ", "  ", "\t", "\n", "\n\n\n", " \n \n", "\r\n", "\r\n\r\n x", "a  b   c    d", "   leading", "trailing   ",
    "tab\there\t\tthere", "x\u00a0y", "a\u200bb", "\u3000full width space", "line1\nline2\n\n\nline3",
    "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "0x1F2E", "v1.2.3-rc4", "٣٤٥ ١٢",
    "I'm you're he's we'll they'd I've DON'T", "'quoted' \"double\"", "rock'n'roll", "o'clock's",
    "Hello, World!", "HELLO world Hello WORLD", "camelCaseWord snake_case_word kebab-case-word",
    "caf\u00e9 cafe\u0301 na\u00efve \u00fcber", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u03b1\u03b2\u03b3 \u0394\u03b5\u03bb\u03c4\u03b1", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\U0001f600\U0001f600\U0001f600 smile", "\u2764\ufe0f", "\U0001f1fa\U0001f1f8 flag", "\ufb01 ligature \u2126 \u212b",
    "math: \u2200x\u2208\u211d, x\u00b2\u22650", "<s> </s> <|endoftext|> <|im_start|>", "[INST] hi [/INST]", "<|im_start|>user\nhi<|im_end|>\n", "<start_of_turn>user\nx<end_of_turn>", "<|begin_of_text|><|eot_id|>", "<s>[INST]x</s>",
    "```python\nfor i in range(10):\n    print(i)\n```", "    indented\n        more", "a\n\tb\n\t\tc",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "$100.50 \u20ac20 \u00a330",
    "!!!???...,,,;;;", "----====____", "...", "\u2026\u2014\u2013", "\\n \\t literal",
    "\u00c0\u00c1\u00c2\u00c3\u00c4\u00c5", "\u1e9e\u00df SS", "\u0130stanbul \u0131", "A" * 40, " " * 17 + "x",
    "word " * 12, "\u0000nul", "\ufffd replacement", "ZWJ\u200dtest", "soft\u00adhyphen",
]

def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    nlc, vocabs = sys.argv[1], [os.path.abspath(v) for v in sys.argv[2:]]
    here = os.path.dirname(os.path.abspath(__file__))
    cumulo = os.path.join(here, "..", "cumulo")
    shutil.copy(os.path.join(here, "tok_sweep.mjs"), os.path.join(nlc, "tok_sweep.mjs"))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(TEXTS, f)
        tpath = f.name
    out = subprocess.run(["node", "tok_sweep.mjs", tpath] + vocabs, cwd=nlc, capture_output=True, text=True)
    os.unlink(tpath)
    refs = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            refs[j["vocab"]] = j
    bad = 0
    for v in vocabs:
        if v not in refs:
            print(f"{os.path.basename(v)}: llama.cpp gave no ids: {out.stderr[-300:]}")
            bad += 1
            continue
        n_bad = 0
        cases = [(t, w, []) for t, w in zip(TEXTS, refs[v]["ids"])]
        cases += [(t, w, ["--special"]) for t, w in zip(TEXTS, refs[v]["special"])]
        for text, want, flags in cases:
            r = subprocess.run([cumulo, "tokenize", v, "-", "--no-bos", "--json"] + flags, input=text.encode(),
                               capture_output=True)
            try:
                got = json.loads(r.stdout)["ids"]
            except (ValueError, KeyError):
                got = "error: " + r.stderr.decode(errors="replace")[-200:]
            if got != want:
                n_bad += 1
                print(f"{os.path.basename(v)}: {text!r} {' '.join(flags)}\n  llama.cpp {want}\n  cumulo    {got}")
        print(f"{os.path.basename(v)}: {len(cases) - n_bad} of {len(cases)} texts (plain and --special) agree")
        bad += n_bad
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
