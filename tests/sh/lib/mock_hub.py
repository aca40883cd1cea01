#!/usr/bin/env python3
"""mock_hub.py: a local HTTP server that answers like the Hugging Face Hub, for
tests/sh/pull.sh (no network here). It serves the files under --root
(ROOT/org/repo/...) through the Hub's routes:

  GET /api/models/ORG/REPO/tree/REV?recursive=true   JSON listing: type, path, size,
      oid, lfs {oid (sha256), size, pointerSize}; paged with a Link: rel="next"
      header when --page-size is given
  GET /ORG/REPO/resolve/REV/PATH   302 to /cdn/SHA256/PATH (as the Hub sends a
      signed CDN address), which serves the bytes, honouring Range (206)

Faults for the tests:
  --drop PATH:BYTES     the first download of PATH closes the connection after BYTES
  --slow PATH:BPS       PATH is sent at BPS bytes/s (so a test can kill a pull midway)
  --wrong-hash PATH     the listing gives PATH a wrong sha256
  --gated ORG/REPO:TOKEN  listing and resolve need "Authorization: Bearer TOKEN"
  --no-range            the CDN ignores Range and always sends the whole file (200)
Every request is logged as one JSON line to --log: method, path, range,
authorization seen (true/false), status.
Prints "PORT <n>" on stdout once listening.
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--slow", action="append", default=[])
    ap.add_argument("--wrong-hash", action="append", default=[])
    ap.add_argument("--gated", action="append", default=[])
    ap.add_argument("--no-range", action="store_true")
    return ap.parse_args()


A = parse_args()
DROP = {p.rsplit(":", 1)[0]: int(p.rsplit(":", 1)[1]) for p in A.drop}
SLOW = {p.rsplit(":", 1)[0]: int(p.rsplit(":", 1)[1]) for p in A.slow}
GATED = {g.rsplit(":", 1)[0]: g.rsplit(":", 1)[1] for g in A.gated}
LOCK = threading.Lock()
SHA = {}


def sha256_of(full):
    st = os.stat(full)
    key = (full, st.st_size, st.st_mtime)
    if key not in SHA:
        h = hashlib.sha256()
        with open(full, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        SHA[key] = h.hexdigest()
    return SHA[key]


def log(rec):
    with LOCK, open(A.log, "a") as f:
        f.write(json.dumps(rec) + "\n")


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def authorized(self, repo):
        tok = GATED.get(repo)
        return tok is None or self.headers.get("Authorization") == "Bearer " + tok

    def do_GET(self):
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        rec = {"method": "GET", "path": path, "query": u.query, "range": self.headers.get("Range"),
               "auth": self.headers.get("Authorization") is not None}
        try:
            code = self.route(path, urllib.parse.parse_qs(u.query))
        except (BrokenPipeError, ConnectionResetError):
            code = "aborted"
        rec["status"] = code
        log(rec)

    def route(self, path, q):
        parts = path.strip("/").split("/")
        if len(parts) >= 6 and parts[0] == "api" and parts[1] == "models" and parts[4] == "tree":
            repo = parts[2] + "/" + parts[3]
            if not self.authorized(repo):
                self.send(401, b'{"error":"Invalid credentials"}')
                return 401
            rdir = os.path.join(A.root, repo)
            if not os.path.isdir(rdir):
                self.send(404, b'{"error":"Repository not found"}')
                return 404
            entries = []
            for dp, dn, fn in os.walk(rdir):
                dn.sort()
                rel = os.path.relpath(dp, rdir)
                if rel != ".":
                    entries.append({"type": "directory", "path": rel, "oid": "0" * 40, "size": 0})
                for f in sorted(fn):
                    full = os.path.join(dp, f)
                    p = os.path.normpath(os.path.join(rel, f)) if rel != "." else f
                    sz = os.path.getsize(full)
                    sha = sha256_of(full)
                    if p in A.wrong_hash:
                        sha = hashlib.sha256(b"not the file").hexdigest()
                    e = {"type": "file", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": sz, "path": p}
                    if f.endswith(".gguf"):
                        e["lfs"] = {"oid": sha, "size": sz, "pointerSize": 134}
                    entries.append(e)
            start = int(q.get("cursor", ["0"])[0])
            headers = []
            if A.page_size:
                page = entries[start:start + A.page_size]
                if start + A.page_size < len(entries):
                    host = self.headers.get("Host")
                    nxt = "http://%s/api/models/%s/tree/%s?recursive=true&cursor=%d" % (
                        host, repo, parts[5], start + A.page_size)
                    headers.append(("Link", '<%s>; rel="next"' % nxt))
            else:
                page = entries
            self.send(200, json.dumps(page).encode(), headers=headers)
            return 200
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = parts[0] + "/" + parts[1]
            if not self.authorized(repo):
                self.send(401, b'{"error":"Invalid credentials"}')
                return 401
            rel = "/".join(parts[4:])
            full = os.path.join(A.root, repo, rel)
            if ".." in parts or not os.path.isfile(full):
                self.send(404, b'{"error":"Entry not found"}')
                return 404
            # another host name for the same server, as the Hub's CDN is another host
            loc = "http://localhost:%d/cdn/%s/%s/%s?sig=abc" % (self.server.server_address[1], sha256_of(full), repo, rel)
            self.send(302, b"", headers=[("Location", loc)])
            return 302
        if len(parts) >= 4 and parts[0] == "cdn":
            repo = parts[2] + "/" + parts[3]
            rel = "/".join(parts[4:])
            full = os.path.join(A.root, repo, rel)
            if ".." in parts or not os.path.isfile(full):
                self.send(404, b"not found", "text/plain")
                return 404
            size = os.path.getsize(full)
            start = 0
            rng = self.headers.get("Range")
            if rng and not A.no_range:
                start = int(rng.split("=")[1].split("-")[0])
                if start >= size:
                    self.send(416, b"", "text/plain", [("Content-Range", "bytes */%d" % size)])
                    return 416
            with open(full, "rb") as f:
                f.seek(start)
                data = f.read()
            code = 206 if start else 200
            self.send_response(code)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            if code == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
            self.end_headers()
            with LOCK:
                drop = DROP.pop(rel, None)
            bps = SLOW.get(rel)
            if drop is not None:
                self.wfile.write(data[:drop])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return "dropped"
            if bps:
                step = max(1, bps // 20)
                for o in range(0, len(data), step):
                    self.wfile.write(data[o:o + step])
                    self.wfile.flush()
                    time.sleep(step / bps)
            else:
                self.wfile.write(data)
            return code
        self.send(404, b'{"error":"no such route"}')
        return 404


srv = ThreadingHTTPServer(("127.0.0.1", A.port), H)
srv.daemon_threads = True
print("PORT %d" % srv.server_address[1], flush=True)
srv.serve_forever()
