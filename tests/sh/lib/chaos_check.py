#!/usr/bin/env python3
"""chaos_check.py: checks the contract of issue 7 on the recorded history of one
chaos scenario (tests/sh/chaos.sh). Not a test by itself; chaos.sh runs it.

    chaos_check.py SCENARIO_DIR REF_DIR [--require-ok WAVES]

WAVES (comma-separated wave tags, e.g. "w3", or "all"): every request of
those waves (request ids are TAG-N) must end in success with the undisturbed
text; an explicit error there is a violation. chaos.sh requires it of every
request of the `none` control and of the wave after each heal, so a server
that answers every request with an error (a 503 to everything) fails.

SCENARIO_DIR holds:
  launched       one request id per line (every request a client started)
  history        one line per request that ended: id prompt stream start end http curl_rc
  ID.body        what the client received (SSE stream or JSON)
  health         one line per /health poll: time http_code
REF_DIR holds wantN: the undisturbed single-machine greedy text of prompt N.

The contract, per request:
  - it ended exactly once (one history line; for a stream exactly one
    terminal event, [DONE] or an error event, and nothing after it);
  - it ended with success (HTTP 200, text equal to the undisturbed text) or
    an explicit error (an HTTP error status with a JSON error, or an SSE
    error event); a reset connection, a timeout or a malformed body is not;
  - the text streamed before an error event is a prefix of the undisturbed
    text (no corrupted, repeated or missing tokens before the error).
And the server stayed up: every /health poll got an HTTP answer, the last 200.
And, for the waves given with --require-ok, success only.
Prints one line per violation, then a summary line
  "requests N ok N error N violations N", and exits 1 on any violation.
"""
import json
import os
import sys


def parse_sse(raw):
    """Returns (text, ending, error text or None, problems). A stream ends
    once: "done" (a finish_reason chunk, then [DONE]) or "error" (one error
    event, then [DONE]); [DONE] is always the last event."""
    text, err, problems = [], None, []
    events = []
    for line in raw.split("\n"):
        line = line.rstrip("\r")
        if line.startswith("data:"):
            events.append(line[5:].strip())
    n_done = sum(1 for ev in events if ev == "[DONE]")
    if n_done != 1 or events[-1] != "[DONE]":
        problems.append("%d [DONE] events%s" % (n_done, "" if events and events[-1] == "[DONE]" else ", not last"))
    n_err = 0
    finished = False
    for i, ev in enumerate(events):
        if ev == "[DONE]":
            continue
        try:
            j = json.loads(ev)
        except ValueError:
            problems.append("malformed SSE event %r" % ev[:80])
            continue
        if "error" in j:
            n_err += 1
            if i != len(events) - 2:
                problems.append("an error event that is not the last before [DONE]")
            e = j["error"]
            err = e.get("message", str(e)) if isinstance(e, dict) else str(e)
            continue
        ch = j.get("choices") or [{}]
        if finished and ch[0].get("text"):
            problems.append("text after the finish_reason chunk")
        if ch[0].get("finish_reason"):
            finished = True
        t = ch[0].get("text")
        if t is None:
            t = (ch[0].get("delta") or {}).get("content") or ""
        text.append(t)
    if n_err > 1:
        problems.append("%d error events" % n_err)
    ending = "error" if n_err else ("done" if finished else "none")
    if ending == "none":
        problems.append("neither a finish_reason nor an error event")
    return "".join(text), ending, err, problems


def main():
    args = sys.argv[1:]
    require = set()
    if "--require-ok" in args:
        k = args.index("--require-ok")
        if k + 1 >= len(args):
            print("usage: chaos_check.py SCENARIO_DIR REF_DIR [--require-ok WAVES]")
            return 2
        require = set(w for w in args[k + 1].split(",") if w)
        del args[k:k + 2]
    if len(args) != 2:
        print("usage: chaos_check.py SCENARIO_DIR REF_DIR [--require-ok WAVES]")
        return 2
    d, refdir = args

    def must_succeed(rid):
        return "all" in require or rid.split("-")[0] in require
    refs = {}
    for f in os.listdir(refdir):
        if f.startswith("want"):
            with open(os.path.join(refdir, f), encoding="utf-8", errors="replace") as fh:
                refs[f[4:]] = fh.read()
    with open(os.path.join(d, "launched")) as fh:
        launched = [x.strip() for x in fh if x.strip()]
    hist = {}
    viol = []
    try:
        with open(os.path.join(d, "history")) as fh:
            lines = [x.split() for x in fh if x.strip()]
    except FileNotFoundError:
        lines = []
    for f in lines:
        if len(f) != 7:
            viol.append("malformed history line %r" % " ".join(f))
            continue
        hist.setdefault(f[0], []).append(f)
    n_ok = n_err = 0
    for rid in launched:
        h = hist.get(rid, [])
        if len(h) != 1:
            viol.append("%s: ended %d times" % (rid, len(h)))
            continue
        _, prompt, stream, t0, t1, code, rc = h[0]
        want = refs.get(prompt)
        if want is None:
            viol.append("%s: no reference for prompt %s" % (rid, prompt))
            continue
        try:
            with open(os.path.join(d, rid + ".body"), encoding="utf-8", errors="replace") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raw = ""
        dur = "%.1f s" % (float(t1) - float(t0))
        if rc != "0":
            viol.append("%s: no explicit end: curl exit %s after %s, HTTP %s, %d bytes: %r" %
                        (rid, rc, dur, code, len(raw), raw[-200:]))
            continue
        if code != "200":
            try:
                j = json.loads(raw)
                msg = j["error"]["message"] if isinstance(j.get("error"), dict) else None
            except (ValueError, KeyError, TypeError):
                msg = None
            if msg and must_succeed(rid):
                viol.append("%s: must succeed (%s), got an explicit error HTTP %s: %s" %
                            (rid, "every request" if "all" in require else "the wave after the heal", code, msg[:160]))
            elif msg:
                n_err += 1
                print("  %s: explicit error HTTP %s: %s" % (rid, code, msg[:160]))
            else:
                viol.append("%s: HTTP %s without a JSON error: %r" % (rid, code, raw[:200]))
            continue
        if stream == "1":
            text, ending, err, probs = parse_sse(raw)
            for p in probs:
                viol.append("%s: %s" % (rid, p))
            if probs:
                continue
            if ending == "error":
                if must_succeed(rid):
                    viol.append("%s: must succeed (%s), got an error event after %d bytes: %s" %
                                (rid, "every request" if "all" in require else "the wave after the heal", len(text),
                                 (err or "")[:160]))
                elif want.startswith(text):
                    n_err += 1
                    print("  %s: explicit error event after %d bytes: %s" % (rid, len(text), (err or "")[:160]))
                else:
                    viol.append("%s: error event, and the %d bytes streamed before it are not a prefix of the "
                                "undisturbed text: %r" % (rid, len(text), text[:200]))
                continue
        else:
            try:
                j = json.loads(raw)
                text = j["choices"][0]["text"]
            except (ValueError, KeyError, IndexError, TypeError):
                viol.append("%s: HTTP 200 with a malformed body: %r" % (rid, raw[:200]))
                continue
        if text == want:
            n_ok += 1
        else:
            k = 0
            while k < min(len(text), len(want)) and text[k] == want[k]:
                k += 1
            viol.append("%s: text differs from the undisturbed run at byte %d (%d vs %d bytes): got %r, want %r" %
                        (rid, k, len(text), len(want), text[max(0, k - 20):k + 40], want[max(0, k - 20):k + 40]))
    for rid in hist:
        if rid not in launched:
            viol.append("%s: ended but was never launched" % rid)
    try:
        with open(os.path.join(d, "health")) as fh:
            polls = [x.split() for x in fh if x.strip()]
    except FileNotFoundError:
        polls = []
    down = [p for p in polls if len(p) != 2 or p[1] == "000"]
    if not polls:
        viol.append("/health was never polled")
    elif down:
        viol.append("/health unanswered %d of %d times (first at %s)" % (len(down), len(polls), down[0][0]))
    elif polls[-1][1] != "200":
        viol.append("/health answered %s at the end" % polls[-1][1])
    if require and not any(must_succeed(rid) for rid in launched):
        viol.append("no request of the waves that must succeed (%s) was launched" % ",".join(sorted(require)))
    for v in viol:
        print("  VIOLATION " + v)
    print("requests %d ok %d error %d violations %d" % (len(launched), n_ok, n_err, len(viol)))
    return 1 if viol else 0


if __name__ == "__main__":
    sys.exit(main())
