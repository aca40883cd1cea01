# tests/sh/lib/serve_client.py: the OpenAI-API client pieces the serving tests
# (tests/sh/http_chunked.sh, http_kvmem.sh, http_prefix.sh) share; not a test.
# Each script's client does `sys.path.insert(0, <this folder>)` and imports it.
import http.client, json, select, time

PORT = 0


def ids(n, seed):
    """n token ids from a seeded LCG (the same ids in every script)."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        out.append(100 + x % 20000)
    return out


def req(prompt, gen, log):
    """One completion, not streamed: log gets status and text (the text plus
    every token's logprob, so equal texts mean equal bits)."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": gen, "temperature": 0,
              "ignore_eos": True, "logprobs": 0}), {"content-type": "application/json"})
    r = c.getresponse()
    body = r.read().decode()
    log["status"] = r.status
    try:
        ch = json.loads(body)["choices"][0]
        log["text"] = ch["text"] + repr(ch["logprobs"]["token_logprobs"])
    except Exception:
        log["text"] = body
    c.close()


def metrics(prefixes=("cumulo_kv_", "cumulo_slots_active", "cumulo_prefix_")):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("GET", "/metrics")
    m = {}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(prefixes):
            k, v = line.split(" ")
            m[k] = float(v)
    c.close()
    return m


def stream(prompt, gen, log, hold=None):
    """One streamed completion: log gets sent, status, times (one per text
    event), text, lp (every token's logprob) and done ([DONE] seen). hold(log)
    is polled; when it returns true the client leaves mid-request."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    body = json.dumps({"prompt": prompt, "max_tokens": gen, "temperature": 0, "stream": True, "ignore_eos": True,
                       "logprobs": 0})
    log["sent"] = time.monotonic()
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    log["status"], log["times"], log["text"], log["done"] = r.status, [], "", False
    buf = b""
    while True:
        if hold:  # poll, so the client can leave while no byte arrives
            if hold(log):
                c.sock.close()  # the client goes away mid-prefill
                return
            if not select.select([c.sock], [], [], 0.05)[0]:
                continue
        d = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not d:
            break
        buf += d
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            s = ev.decode()
            if not s.startswith("data: "):
                continue
            s = s[6:]
            if s == "[DONE]":
                log["done"] = True
                continue
            j = json.loads(s)
            ch = j.get("choices") or [{}]
            lp = ch[0].get("logprobs") if ch else None
            if lp:  # every token's logprob: the exact bits of the model's output, not just its argmax
                log["lp"] = log.get("lp", []) + lp.get("token_logprobs", [])
            if ch and ch[0].get("text"):
                log["times"].append(time.monotonic())
                log["text"] += ch[0]["text"]
    c.close()
