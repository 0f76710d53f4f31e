"""What keeps minirl/judge/server.py serving under abuse: a cap on open connections, a deadline on reading each
request, a strict Content-Length, and a JSON parse bounded before it builds anything.

    httpd = GuardedHTTPServer(("127.0.0.1", 0), Handler, max_connections=128, request_deadline_s=60)
    httpd.reading(sock) / httpd.working(sock)      # the handler says which phase its connection is in
    length = content_length(headers.get("Content-Length"), MAX_BODY_BYTES)   # RequestError if not a byte count
    body = parse_body(raw)                         # a dict, or RequestError / ValueError / RecursionError

Why each:
- A connection costs a thread and a descriptor. A client that sends a byte every 59 s (or nothing) held both for
  ever: every connection now has `request_deadline_s` to deliver its whole request (headers and body; an idle
  keep-alive connection counts as reading its next one), and a watchdog shuts down the socket of one past it.
  While its request is being judged the deadline does not apply (a program may take minutes of tests).
- At `max_connections`, a new connection evicts the one that has been reading longest (an idle client, most
  likely: an honest request on a private network is read in milliseconds); if every connection is being judged,
  the new one gets a 503 at once. So idle clients can never lock honest ones out, and the accept loop never
  meets the descriptor limit (where it used to spin).
- `Content-Length: ²` passes str.isdigit() and int() raises; 5,000 digits parse and overflow nothing but take
  time: only ASCII digits, at most 12 of them.
- json.loads builds every value before the caller can look at it: 16 MiB of `[{},{},...]` is 417 MiB of dicts.
  The body must start with `{`, and its count of `,` and `:` (an upper bound on the values inside containers:
  separators in strings count too) is capped at MAX_JSON_ITEMS before parsing, so a body's objects stay within
  ~100 MiB whatever its shape. Too deep a nesting is json's own RecursionError.
Left out: authentication and per-client quotas (the server binds 127.0.0.1 by default; put it on a private network).
"""
from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer

MAX_JSON_ITEMS = 1 << 20           # separators in a body: ~1M values (~100 MiB as Python objects) at most
_STARTS_AN_OBJECT = re.compile(rb"[ \t\r\n]*\{")
_DIGITS = re.compile(r"[0-9]{1,12}")


class RequestError(ValueError):
    """A request this server cannot serve: answered 400 with FastAPI's {"detail": ...} body."""


def content_length(value: str | None, limit: int) -> int:
    """The body's length in bytes from a Content-Length header (absent: 0); RequestError unless it is ASCII
    digits and at most `limit`."""
    if value is None:
        return 0
    if not _DIGITS.fullmatch(value.strip()) or int(value) > limit:
        raise RequestError(f"Content-Length must be a byte count <= {limit}, got {value[:40]!r}")
    return int(value)


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, refused before it is built if it is not an object or has more than
    MAX_JSON_ITEMS separators. ValueError (bad JSON, integers past 4300 digits) and RecursionError (too deep)
    pass through for the caller to answer 400."""
    if not _STARTS_AN_OBJECT.match(raw):
        raise RequestError("the body must be a JSON object")
    items = raw.count(b",") + raw.count(b":")
    if items > MAX_JSON_ITEMS:
        raise RequestError(f"the body has {items} separators; this server parses at most {MAX_JSON_ITEMS}")
    return json.loads(raw)                         # "{" and valid JSON: an object


class GuardedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `max_connections` open, and `request_deadline_s` to read each request."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int = 128, request_deadline_s: float = 60.0):
        self.max_connections, self.request_deadline_s = max_connections, request_deadline_s
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._reading: dict[socket.socket, float] = {}   # socket -> when it started reading its request
        self._closed = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._watch, daemon=True, name="judge-server-watchdog").start()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def reading(self, sock: socket.socket) -> None:
        """`sock` waits for (the rest of) a request: its deadline runs."""
        with self._lock:
            if sock in self._open:
                self._reading[sock] = time.monotonic()

    def working(self, sock: socket.socket) -> None:
        """`sock`'s request is read: it is being judged, no deadline."""
        with self._lock:
            self._reading.pop(sock, None)

    def process_request(self, request, client_address):
        with self._lock:
            if len(self._open) >= self.max_connections and not self._reading:
                full = True
            else:
                full = False
                if len(self._open) >= self.max_connections:   # evict the connection reading longest
                    oldest = min(self._reading, key=self._reading.get)
                    self._drop(oldest)
                self._open.add(request)
                self._reading[request] = time.monotonic()
        if full:
            _refuse(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._lock:
            self._open.discard(request)
            self._reading.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        """Quiet for a client that hung up (what abusive clients do); a traceback for anything else."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def server_close(self):
        self._closed.set()
        super().server_close()

    def _drop(self, sock: socket.socket) -> None:
        """Make `sock`'s thread see end of file (called with the lock held): its handler then closes it."""
        self._reading.pop(sock, None)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _watch(self) -> None:
        step = min(1.0, self.request_deadline_s / 4)
        while not self._closed.wait(step):
            now = time.monotonic()
            with self._lock:
                for sock, since in list(self._reading.items()):
                    if now - since > self.request_deadline_s:
                        self._drop(sock)


def _refuse(sock: socket.socket) -> None:
    """503 to a connection over the cap while every open one is being judged, from the accept loop: a few bytes
    to a new socket, never blocking for long."""
    body = b'{"detail": "the judge server is at its connection limit; retry"}'
    try:
        sock.settimeout(1.0)
        sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    except OSError:
        pass
    finally:
        sock.close()
