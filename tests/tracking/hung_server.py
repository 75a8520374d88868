"""A tracking server that hangs: it answers ``GET .../health`` with 200 OK, as a live MLflow
server does, and holds every other request open without a byte of answer, as a server stuck
behind a dead database or a proxy holding the line does. It serves on 127.0.0.1 from a
thread, and gives up by itself after ``life`` seconds (then every held request is closed),
so a test that fails cannot leave it running."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HungServer:
    def __init__(self, life: float = 120.0):
        self.paths: list[str] = []  # every request's method and path, in arrival order
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.paths.append(f"{self.command} {self.path}")
                if self.path.rstrip("/").endswith("/health"):
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"OK")
                    return
                outer.release.wait(life)  # never answered; closed when the server stops
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.timer = threading.Timer(life, self.stop)
        self.timer.daemon = True
        self.timer.start()

    def api_calls(self) -> list[str]:
        return [p for p in self.paths if not p.rstrip("/").endswith("/health")]

    def stop(self) -> None:
        self.timer.cancel()
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HungServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
