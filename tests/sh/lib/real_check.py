#!/usr/bin/env python3
"""tests/sh/lib/real_check.py: compare one `cumulo run --json --logprobs 10`
output with one case of a real-model reference (tests/data/real/*.json,
written by tools/real_oracle.mjs from llama.cpp). Used by
tests/sh/real_models.sh; not a test itself.

  real_check.py REF.json CASE OUT.json [--ids-only] [--margin M] [--min-match K]
                [--tol-max X] [--tol-med Y] [--chat-template NAME]
                [--same-as ONE.json --tie T]
                [--run BIN MODEL [CUMULO_RUN_ARGS...]]

With --run (last), it first runs `BIN run MODEL` on the case's prompt (text,
or --chat with the user message; --chat-template NAME instead of --chat for
a model whose GGUF has no template) for as many tokens as the reference has,
greedy, 1 thread unless the args say otherwise, --json --logprobs 10, plus the
given args, into OUT.json (stderr into OUT.json.err).

Checks, each printed as a FAIL line when broken (exit 1):
 - the prompt's token ids equal llama.cpp's (tokenizer, BOS, chat template);
 - greedy ids equal llama.cpp's; a first difference is accepted only at a
   step where llama.cpp's own top-1 margin p1 - p2 is below M, and only after
   at least K equal ids; nothing after it is compared;
 - unless --ids-only: at every step up to the first difference, the
   reference's top-10 probabilities: max |p - p_llama.cpp| over them (a
   reference token missing from our top 10 counts as p_ref - our 10th, a
   lower bound of its error), and every token of our top 10 missing from the
   reference's is below its 10th + the error; the largest such error over the
   steps must be <= X and their median <= Y.
With --same-as (a cluster run against one machine's ONE.json, both of
which must follow llama.cpp's ids as far as compared): the ids must equal
ONE.json's, except that a tensor-parallel group sums its partial products
in another order, so a first difference is accepted where llama.cpp's
margin at that step (same prefix) is below T.
Prints one summary line: name, equal ids, first difference, margin there,
max and median probability error.
"""
import json
import math
import subprocess
import sys


def run_cumulo(case, n, out_path, rest, template):
    bin_, model, extra = rest[0], rest[1], rest[2:]
    args = [bin_, "run", model, "-n", str(n), "--temp", "0", "--json", "--logprobs", "10"]
    if "--threads" not in extra:
        args += ["--threads", "1"]
    chat = ["--chat-template", template] if template else ["--chat"]
    args += chat + ["-p", case["chat"]] if "chat" in case else ["-p", case["text_prompt"]]
    with open(out_path, "w") as o, open(out_path + ".err", "w") as e:
        subprocess.run(args + extra, stdout=o, stderr=e, timeout=600)


def main(argv):
    ref_path, name, out_path = argv[1:4]
    opts = {"--tie": 0.0, "--margin": 0.0, "--min-match": 64, "--tol-max": 1.0, "--tol-med": 1.0}
    ids_only = False
    run = None
    template = None
    same_as = None
    i = 4
    while i < len(argv):
        if argv[i] == "--run":
            run = argv[i + 1:]
            break
        if argv[i] == "--chat-template":
            template = argv[i + 1]
            i += 2
        elif argv[i] == "--same-as":
            same_as = argv[i + 1]
            i += 2
        elif argv[i] == "--ids-only":
            ids_only = True
            i += 1
        else:
            opts[argv[i]] = float(argv[i + 1])
            i += 2
    ref = json.load(open(ref_path))
    case = next(c for c in ref["cases"] if c["name"] == name)
    if run is not None:
        run_cumulo(case, len(case["greedy"]), out_path, run, template)
    try:
        out = json.load(open(out_path))
    except (OSError, ValueError) as e:
        print(f"FAIL: {name}: no cumulo output ({e})")
        return 1
    bad = []
    if same_as is not None:
        one = json.load(open(same_as))["tokens"]
        got = out["tokens"]
        k = next((k for k in range(min(len(got), len(one))) if got[k] != one[k]), None)
        if k is None:
            print(f"# {name}: {len(got)} ids equal to one machine's")
            return 0 if len(got) == len(one) else 1
        m = case["margins"][k] if k < len(case["margins"]) else 1.0
        print(f"# {name}: ids equal to one machine's up to step {k} (llama.cpp margin there {m:.4f})")
        if m >= opts["--tie"] or one[:k] != case["greedy"][:k]:
            print(f"FAIL: {name}: id {k} differs from one machine's where llama.cpp's margin is {m:.4f}")
            return 1
        return 0
    if out["prompt_tokens"] != case["prompt"]:
        bad.append(f"prompt ids differ: {out['prompt_tokens'][:24]} vs llama.cpp {case['prompt'][:24]}")
    got, want = out["tokens"], case["greedy"]
    n = min(len(got), len(want))
    first = next((k for k in range(n) if got[k] != want[k]), None)
    # llama.cpp's list ends with the end-of-generation token it chose; cumulo
    # stops there without printing it
    if first is None and len(got) == len(want) - 1 and out.get("finish_reason") == "eog":
        pass
    elif first is None and len(got) < len(want) and out.get("finish_reason") == "eog":
        first = len(got)  # cumulo chose the end-of-generation token where llama.cpp went on: a difference there
    elif first is None and len(got) != len(want):
        bad.append(f"{len(got)} ids vs llama.cpp's {len(want)}")
    margin = case["margins"][first] if first is not None else None
    if first is not None:
        if margin >= opts["--margin"]:
            mine = got[first] if first < len(got) else "end"
            bad.append(f"id {first} differs ({mine} vs {want[first]}) where llama.cpp's margin is {margin:.4f}")
        if first < opts["--min-match"]:
            bad.append(f"only {first} equal ids (want {int(opts['--min-match'])})")
    errs = []
    if not ids_only:
        last = min(first if first is not None else n - 1, len(out["logprobs"]) - 1)
        for k in range(last + 1):
            st = case["steps"][k]
            mine = {t: math.exp(lp) for t, lp in out["logprobs"][k]["top"]}
            floor = min(mine.values())
            e = 0.0
            for t, p in zip(st["ids"], st["p"]):
                e = max(e, abs(mine[t] - p) if t in mine else max(0.0, p - floor))
            for t, p in mine.items():
                if t not in st["ids"]:
                    e = max(e, p - st["p"][-1])
            errs.append(e)
        mx = max(errs)
        med = sorted(errs)[len(errs) // 2]
        if mx > opts["--tol-max"]:
            k = errs.index(mx)
            bad.append(f"step {k}: max |p - p_llama.cpp| = {mx:.3g} > {opts['--tol-max']}")
        if med > opts["--tol-med"]:
            bad.append(f"median |p - p_llama.cpp| = {med:.3g} > {opts['--tol-med']}")
    eq = first if first is not None else n
    summary = f"# {name}: {eq}/{len(want)} ids equal"
    if first is not None:
        summary += f", first difference at {first} (llama.cpp margin {margin:.4f})"
    if errs:
        summary += f"; probs max {max(errs):.2e} median {sorted(errs)[len(errs) // 2]:.2e} over {len(errs)} steps"
    print(summary)
    for b in bad:
        print(f"FAIL: {name}: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
