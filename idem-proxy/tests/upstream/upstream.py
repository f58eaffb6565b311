"""A test upstream for idem-proxy, standard library only: it counts the effects it makes.

    python3 upstream.py PORT      (0: any free port; the first line printed says which)

POST /charges[?delay_ms=N]  a charge: 201, JSON, X-Charge-Id, Set-Cookie, the Idempotency-Key it got
POST /fail                  500 each time (counted)
POST /big?size=N            201 with N bytes
GET  /count                 {"runs": N, "charges": {KEY: N}}: the effects made so far
GET  /echo                  the request's path and headers, without buffering (a GET is never keyed)
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

lock = threading.Lock()
runs = 0
charges = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body, ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/count":
            with lock:
                body = json.dumps({"runs": runs, "charges": charges}).encode()
            self.send(200, body)
        else:
            body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
            self.send(200, body)

    def do_POST(self):
        global runs
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        key = self.headers.get("Idempotency-Key", "")
        delay = int(query.get("delay_ms", ["0"])[0])
        if delay:
            time.sleep(delay / 1000)
        with lock:
            runs += 1
            n = runs
            charges[key] = charges.get(key, 0) + 1
        if url.path == "/fail":
            self.send(500, b'{"error":"boom"}')
        elif url.path == "/big":
            size = int(query.get("size", ["0"])[0])
            self.send(201, b"x" * size, "text/plain")
        else:
            body = json.dumps({"id": n, "key": key, "body": data.decode("utf-8", "replace")}).encode()
            self.send(
                201,
                body,
                headers=[
                    ("X-Charge-Id", "ch_%d" % n),
                    ("Set-Cookie", "session=s%d" % n),
                    ("Location", "/charges/%d" % n),
                ],
            )


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("listening %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
