"""idle_flood.py PORT PID: the idle-connection attack against a running
`cumulo serve` (tests/sh/http_idle.sh runs it). Opens N_IDLE connections that
send nothing (spread over 127.0.0.2-5, under the per-address limit) and a
slowloris of N_SLOW connections that send one header byte a second, then,
with all of them open, asks /health N_HEALTH times and runs 8 streaming
completions at once. Prints one JSON line of measurements; the shell script
checks it. No timing is asserted here beyond generous bounds (see
TESTING.md): the point is that every request is answered at all, where a
thread-per-connection server with 64 threads never answers.
"""
import json
import socket
import sys
import threading
import time

PORT, PID = int(sys.argv[1]), int(sys.argv[2])
N_IDLE, N_SLOW, N_HEALTH, N_STREAM = 1000, 50, 40, 8
HOLD_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def threads():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def connect(src):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", PORT))
    return s


def get(path, timeout=5.0):
    """One HTTP/1.1 request on a fresh connection; (status, body, seconds)."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    dt = time.monotonic() - t0
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return status, body, dt


def stream(i, out):
    body = json.dumps({"prompt": ["Once upon a time", "The little dog", "Lily and Ben", "One day"][i % 4],
                       "max_tokens": 100, "temperature": 0, "stream": True})
    try:
        s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        out[i] = b"data: [DONE]" in data and b" 200 " in data.split(b"\r\n", 1)[0] + b" "
    except OSError as e:
        out[i] = False
        print(f"stream {i}: {e}", file=sys.stderr)


rss0 = rss_kib()
th0 = threads()
idle, slow = [], []
refused = 0
for k in range(N_IDLE):
    try:
        idle.append(connect(f"127.0.0.{2 + k % 4}"))
    except OSError:
        refused += 1
for k in range(N_SLOW):
    s = connect("127.0.0.6")
    s.sendall(b"GET /health HTTP/1.1\r\n")
    slow.append(s)
t_open = time.monotonic()
stop = threading.Event()


def trickle():
    n = 0
    while not stop.is_set():
        for s in slow:
            try:
                s.sendall(b"X-a: b\r\n"[n % 8:n % 8 + 1])
            except OSError:
                pass
        n += 1
        stop.wait(1.0)


tt = threading.Thread(target=trickle, daemon=True)
tt.start()
time.sleep(0.5)  # let the server accept them all
lat, bad_health = [], 0
for _ in range(N_HEALTH):
    try:
        st, body, dt = get("/health")
        lat.append(dt)
        if st != 200 or b'"ok"' not in body:
            bad_health += 1
    except OSError:
        bad_health += 1
res = [None] * N_STREAM
ths = [threading.Thread(target=stream, args=(i, res)) for i in range(N_STREAM)]
t0 = time.monotonic()
for t in ths:
    t.start()
# /health while the streams run
lat2 = []
while any(t.is_alive() for t in ths) and len(lat2) < 1000:
    try:
        st, body, dt = get("/health")
        lat2.append(dt)
        if st != 200:
            bad_health += 1
    except OSError:
        bad_health += 1
for t in ths:
    t.join(120)
t_streams = time.monotonic() - t0
rss1 = rss_kib()
th1 = threads()
# are the idle ones still open (the server kept them), and do they get closed at the timeout?
open_now = 0
for s in idle:
    s.setblocking(False)
    try:
        b = s.recv(1)
        if b:
            open_now += 1
    except BlockingIOError:
        open_now += 1
    except OSError:
        pass
closed_later = 0
if HOLD_S > 0:
    deadline = t_open + HOLD_S
    time.sleep(max(0.0, deadline - time.monotonic()))
    for s in idle + slow:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed_later += 1
        except BlockingIOError:
            pass
        except OSError:
            closed_later += 1
stop.set()
for s in idle + slow:
    s.close()
lat.sort()
lat2.sort()
allh = sorted(lat + lat2)
print(json.dumps({
    "idle": len(idle), "idle_refused": refused, "slowloris": len(slow), "idle_open_after_streams": open_now,
    "health_answered": len(allh), "health_bad": bad_health,
    "health_p50_ms": round(allh[len(allh) // 2] * 1e3, 2) if allh else None,
    "health_p99_ms": round(allh[min(len(allh) - 1, int(len(allh) * 0.99))] * 1e3, 2) if allh else None,
    "health_max_ms": round(allh[-1] * 1e3, 2) if allh else None,
    "health_during_streams": len(lat2),
    "streams_done": sum(1 for r in res if r), "streams": N_STREAM, "streams_s": round(t_streams, 2),
    "rss_before_kib": rss0, "rss_during_kib": rss1, "threads_before": th0, "threads_during": th1,
    "closed_by_timeout": closed_later, "held": len(idle) + len(slow),
}))
