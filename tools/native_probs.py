#!/usr/bin/env python3
# tools/native_probs.py: a second llama.cpp opinion on a synthetic model's
# reference (tests/data/synth/NAME.json, made by node-llama-cpp): the same
# teacher-forced top-16 distributions from a natively built llama-server
# (bench/llamacpp.sh builds one), one request per position, and the largest
# |p - p_ref| per position. With the prompt cache on (default) each position
# after a case's first is a one-token decode; NOCACHE=1 evaluates every
# prefix as one batch. It measures how far llama.cpp's own paths (decode vs
# batch, one build vs another) disagree where a golden comparison is tight.
#
# usage: python3 tools/native_probs.py MODEL.gguf REF.json [PORT]
#   MODEL.gguf: `cumulo synth` with the reference's "command" arguments
#   LLAMA_SERVER: the server binary (default: the bench's native build)
import json, math, os, subprocess, sys, time, urllib.request

model, ref = sys.argv[1], sys.argv[2]
port = int(sys.argv[3]) if len(sys.argv) > 3 else 18391
server = os.environ.get("LLAMA_SERVER", "/work/cache/llamacpp-native/native/bin/llama-server")
R = json.load(open(ref))
kv = R.get("kv", "F32").split("/")
srv = subprocess.Popen([server, "-m", model, "-t", "1", "-tb", "1", "-c", "512", "--port", str(port),
                        "-fa", "on" if R.get("flash") else "off", "-ctk", kv[0].lower(), "-ctv", kv[-1].lower(),
                        "-np", "1", "--no-warmup", "-b", "512", "-ub", "512"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except Exception:
            time.sleep(0.2)
    for ci, c in enumerate(R["cases"]):
        ids, errs = (c["prompt"] + c["greedy"])[:8], []
        for p in range(8):
            body = {"prompt": ids[:p + 1], "n_predict": 1, "n_probs": 16, "temperature": 1.0, "top_k": 0,
                    "top_p": 1.0, "min_p": 0.0, "cache_prompt": os.environ.get("NOCACHE") != "1",
                    "post_sampling_probs": False}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            top = json.loads(urllib.request.urlopen(req, timeout=60).read())["completion_probabilities"][0]["top_logprobs"]
            mine = {t["id"]: math.exp(t["logprob"]) for t in top}
            d = c["probs_decode"][p]
            errs.append(max(abs(mine.get(i, 0.0) - q) for i, q in zip(d["ids"], d["p"])))
        print(f"case {ci}: max |p - p_ref| per position:", " ".join(f"{e:.1e}" for e in errs))
finally:
    srv.terminate()
    srv.wait()
