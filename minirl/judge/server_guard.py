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
- At `max_connections`, a new connection evicts the one that has been reading its request (or writing its
  reply) longest (an idle or slow client, most likely: an honest request on a private network is read in
  milliseconds); if every connection is being judged, the new one gets a 503 at once. So idle and slow clients
  cannot lock honest ones out (clients whose programs are being judged can: one per connection), and the accept loop never
  meets the descriptor limit (where it used to spin).
- `Content-Length: ²` passes str.isdigit() and int() raises; 5,000 digits parse and overflow nothing but take
  time: only ASCII digits, at most 12 of them.
- json.loads builds every value before the caller can look at it: 16 MiB of `[{},{},...]` is 417 MiB of dicts.
  The body must start with `{`, and its count of `,` and `:` outside strings (an upper bound on the values
  inside containers; a test input of 2 MB of "1,2,3,..." is one string) is capped at MAX_JSON_ITEMS before
  parsing, so a body's objects stay within ~100 MiB whatever its shape. Too deep a nesting is json's own
  RecursionError.
- Bodies: every one is read whole into memory and held while it is judged, so the bound was max_connections x
  256 MiB. A server-wide budget (`body_budget_bytes`, 1 GiB) is reserved before a body is read; past it: 503.
- Refusals (413, 503) are sent before the body is read. Closing a socket with unread data resets it, and a
  client still sending its body loses the reply (urllib raises BrokenPipeError, not the 503): `discard` drains
  the declared body into no buffer, at most DISCARD_BYTES and 2 s, then closes (Apache's "lingering close").
- Replies: a client that reads its reply slowly, or never, held its connection as "being judged" for ever (4 at
  --max-connections 4 locked honest clients out). Writing a reply has `reply_deadline_s` (10 s), and a
  connection writing one is evictable at the cap like one reading its request. A reply's outputs are cut to
  server.py's REPLY_OUTPUT_BYTES of JSON (16 MiB of "\x01" was 96 MiB of escapes), and replies being written
  share a server-wide budget (`reply_budget_bytes`, 256 MiB): a reply waits up to `reply_deadline_s` for room,
  then is a 503 (8 clients that never read their 96 MiB replies held 1.1 GiB). The budget is reserved before the
  reply's JSON exists (server.py writes it a piece at a time), and replies waiting for room, which hold their
  outputs, share a second budget of the same size; past it, a 503 at once (40 non-reading clients held 1.7 GiB).
- The connection cap is clamped at start to what RLIMIT_NOFILE leaves (`connection_cap`): past the descriptor
  limit accept() failed before the cap was reached, so no idle connection was ever evicted.
Left out: authentication and per-client quotas (the server binds 127.0.0.1 by default; put it on a private network).
"""
from __future__ import annotations

import json
import os
import re
import resource
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer

DISCARD_BYTES = 16 << 20           # drained after a refusal so that the client reads it (a bigger body: reset)
MAX_JSON_ITEMS = 1 << 20           # separators in a body: ~1M values (~100 MiB as Python objects) at most
_STARTS_AN_OBJECT = re.compile(rb"[ \t\r\n]*\{")
_DIGITS = re.compile(r"[0-9]{1,12}")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


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


def refuse(handler, status: int, detail: str) -> None:
    """Answer a request without keeping its body (handler: server.py's), drain the body (`discard`), close."""
    handler.close_connection = True
    handler.send_json(status, {"detail": detail})
    discard(handler.rfile, handler.connection, handler.headers.get("Content-Length"))


def discard(rfile, sock: socket.socket, declared: str | None) -> None:
    """Read and drop up to the declared body (at most DISCARD_BYTES) for at most 2 s, so that a refused
    client reads its reply before the socket closes."""
    left = min(int(declared.strip()) if declared and _DIGITS.fullmatch(declared.strip()) else 0, DISCARD_BYTES)
    end = time.monotonic() + 2.0
    try:
        while left > 0 and time.monotonic() < end:
            sock.settimeout(min(1.0, max(0.01, end - time.monotonic())))
            chunk = rfile.read1(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)
    except OSError:                                # timeout, reset: the client is gone or too slow; close
        pass


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, refused before it is built if it is not an object or has more than
    MAX_JSON_ITEMS separators. ValueError (bad JSON, integers past 4300 digits) and RecursionError (too deep)
    pass through for the caller to answer 400."""
    if not _STARTS_AN_OBJECT.match(raw):
        raise RequestError("the body must be a JSON object")
    items = raw.count(b",") + raw.count(b":")
    if items > MAX_JSON_ITEMS:                     # those inside strings are no values: count the rest
        outside = _JSON_STRING.sub(b"", raw)      # in C; a copy no larger than the body
        items = outside.count(b",") + outside.count(b":")
    if items > MAX_JSON_ITEMS:
        raise RequestError(f"the body has {items} separators; this server parses at most {MAX_JSON_ITEMS}")
    return json.loads(raw)                         # "{" and valid JSON: an object


class GuardedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `max_connections` open, and `request_deadline_s` to read each request."""

    daemon_threads = True
    request_queue_size = 128  # listen()'s backlog: at socketserver's 5, a burst of clients waited 1 s per SYN resent

    def __init__(self, address, handler, max_connections: int = 128, request_deadline_s: float = 60.0,
                 reply_deadline_s: float = 10.0, body_budget_bytes: int = 1 << 30,
                 reply_budget_bytes: int = 256 << 20, spare_descriptors: int = 64):
        self.max_connections = connection_cap(max_connections, spare_descriptors)
        self.request_deadline_s = request_deadline_s
        self.reply_deadline_s, self.body_budget_bytes = reply_deadline_s, body_budget_bytes
        self.reply_budget_bytes = reply_budget_bytes
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)     # a reply's bytes were given back
        self._replies = 0                                # bytes of replies being written, held
        self._waiting = 0                                # bytes of replies waiting for room, held
        self._open: set[socket.socket] = set()
        self._reading: dict[socket.socket, float] = {}   # socket -> when it started reading its request
        self._replying: dict[socket.socket, float] = {}  # socket -> when it started writing its reply
        self._bodies = 0                                 # bytes of request bodies read or being read, held
        self._closed = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._watch, daemon=True, name="judge-server-watchdog").start()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def reading(self, sock: socket.socket) -> None:
        """`sock` waits for (the rest of) a request: its deadline runs."""
        with self._lock:
            self._replying.pop(sock, None)
            if sock in self._open:
                self._reading[sock] = time.monotonic()

    def working(self, sock: socket.socket) -> None:
        """`sock`'s request is read: it is being judged, no deadline."""
        with self._lock:
            self._reading.pop(sock, None)

    def replying(self, sock: socket.socket) -> None:
        """`sock`'s reply is being written: `reply_deadline_s` runs, and it may be evicted (a client that reads
        its reply slowly, or never, held its connection and thread for ever)."""
        with self._lock:
            self._reading.pop(sock, None)
            if sock in self._open:
                self._replying[sock] = time.monotonic()

    def take_body(self, n: int) -> bool:
        """Reserve `n` bytes of the server-wide budget for a request body (read, parsed, judged); False if
        bodies already hold it: the caller answers 503 (max_connections x 256 MiB bodies was the bound)."""
        with self._lock:
            if n and self._bodies + n > self.body_budget_bytes:
                return False
            self._bodies += n
            return True

    def give_body(self, n: int) -> None:
        with self._lock:
            self._bodies -= n

    def take_reply(self, n: int) -> bool:
        """Reserve `n` bytes of the server-wide budget for a reply being written, waiting up to
        `reply_deadline_s` for room (a reply larger than the whole budget waits for every other); False if there
        is none by then, or at once where the replies already waiting hold a budget's worth: the caller answers 503.
        A waiting reply holds its outputs, so waiters share a budget of their own: the server holds at most twice
        `reply_budget_bytes` of replies (40 clients that never read each held their whole output while waiting)."""
        with self._room:
            fits = lambda: self._replies == 0 or self._replies + n <= self.reply_budget_bytes  # noqa: E731
            if not fits():
                if self._waiting and self._waiting + n > self.reply_budget_bytes:
                    return False
                self._waiting += n
                try:
                    if not self._room.wait_for(fits, timeout=self.reply_deadline_s):
                        return False
                finally:
                    self._waiting -= n
            self._replies += n
            return True

    def give_reply(self, n: int) -> None:
        with self._room:
            self._replies -= n
            self._room.notify_all()

    def process_request(self, request, client_address):
        with self._lock:
            waiting = {**self._replying, **self._reading}    # reading a request or a reply: evictable
            if len(self._open) >= self.max_connections and not waiting:
                full = True
            else:
                full = False
                if len(self._open) >= self.max_connections:   # evict the one waiting longest
                    self._drop(min(waiting, key=waiting.get))
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
            self._replying.pop(request, None)
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
        self._replying.pop(sock, None)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _watch(self) -> None:
        while not self._closed.wait(min(1.0, self.request_deadline_s / 4, self.reply_deadline_s / 4)):
            now = time.monotonic()
            with self._lock:
                for waiting, deadline in ((self._reading, self.request_deadline_s),
                                          (self._replying, self.reply_deadline_s)):
                    for sock, since in list(waiting.items()):
                        if now - since > deadline:
                            self._drop(sock)


def connection_cap(wanted: int, spare: int = 64) -> int:
    """`wanted` connections, at most what RLIMIT_NOFILE's soft limit leaves after the descriptors open now and
    `spare` more (the judge's sandboxes, pipes and files while it runs tests). Past the descriptor limit,
    accept() failed before the cap was reached, and no idle connection was ever evicted (round 5)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        in_use = len(os.listdir("/proc/self/fd"))      # this process's own: the judge's, the caller's
    except OSError:
        in_use = 0
    return max(1, min(wanted, soft - in_use - spare))


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
