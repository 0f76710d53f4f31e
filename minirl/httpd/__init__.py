"""A small HTTP server on the standard library, served from a background thread: the base of minirl's servers
(the judge's SandboxFusion API, the OpenAI-compatible endpoint), outside the RL core, which serves nothing.
One thread per request; loopback by default, since nothing here authenticates unless the server built on it
does."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BackgroundServer:
    """`handler` on (host, port) (port 0: any free one). `start()` serves from a daemon thread; a command line
    calls `serve_until_interrupted()`. `url_path` is appended to `url`."""

    url_path = ""
    server_class = ThreadingHTTPServer   # a subclass may guard its connections (minirl/judge/server_guard.py)

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str, **server_options):
        self.httpd = self.server_class((host, port), handler, **server_options)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name=name)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.url_path}"

    def start(self):
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def serve_until_interrupted(self) -> None:
        """Serve on this thread (a command line) until Ctrl-C, then release the port."""
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.httpd.server_close()
