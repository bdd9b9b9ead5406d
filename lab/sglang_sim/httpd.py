"""HTTP plumbing: routes, the API key, JSON and server-sent events over HTTP/1.1.

Keep-alive connections are closed after 5 idle seconds and access lines are
logged as uvicorn logs them under SGLang.
"""

import json
import logging
import socket
import threading
from collections.abc import Callable, Generator, Mapping
from contextlib import closing
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# SGLang's API key middleware lets these through without a key.
OPEN_PREFIXES = ("/health", "/metrics")


class BadRequest(ValueError):
    """A request the server refuses with 400 and an OpenAI error body."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Message
    body: bytes

    def json(self) -> dict:
        try:
            payload = json.loads(self.body or b"{}")
        except ValueError as error:
            raise BadRequest(f"invalid JSON body: {error}") from None
        if not isinstance(payload, dict):
            raise BadRequest("the JSON body must be an object")
        return payload


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    chunks: Generator[bytes, None, None] | None = None


def json_response(payload: object, status: int = 200) -> Response:
    return Response(status, json.dumps(payload).encode())


def error_response(message: str, status: int, kind: str) -> Response:
    """SGLang's OpenAI-style error body."""
    return json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        status,
    )


def sse_response(events: Generator[object, None, None]) -> Response:
    """A server-sent event stream: ``data: <json>`` per event, then ``data: [DONE]``."""

    def chunks() -> Generator[bytes, None, None]:
        with closing(events):
            for event in events:
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return Response(200, content_type="text/event-stream", chunks=chunks())


Route = Callable[[Request], Response]


class App:
    """Routes by path and method, behind SGLang's API key check."""

    def __init__(self, routes: Mapping[str, Mapping[str, Route]], api_key: str | None) -> None:
        self._routes = routes
        self._api_key = api_key

    def respond(self, request: Request) -> Response:
        if not self._authorized(request):
            return json_response({"error": "Unauthorized"}, 401)
        methods = self._routes.get(request.path)
        if methods is None:
            return json_response({"detail": "Not Found"}, 404)
        route = methods.get(request.method)
        if route is None:
            return json_response({"detail": "Method Not Allowed"}, 405)
        try:
            return route(request)
        except BadRequest as error:
            return error_response(str(error), 400, "BadRequestError")

    def _authorized(self, request: Request) -> bool:
        if not self._api_key or request.path.startswith(OPEN_PREFIXES):
            return True
        return request.headers.get("Authorization") == f"Bearer {self._api_key}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    timeout = 5

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(self.command, urlsplit(self.path).path, self.headers,
                          self.rfile.read(length))
        response = self.server.app.respond(request)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        if response.chunks is None:
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
        else:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._write_chunks(response.chunks)

    def _write_chunks(self, chunks: Generator[bytes, None, None]) -> None:
        """Stream until done or until the client hangs up (which aborts its request)."""
        try:
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            chunks.close()
            self.close_connection = True

    def log_request(self, code: object = "-", size: object = "-") -> None:
        host, port = self.client_address[:2]
        logger.info('%s:%s - "%s" %s', host, port, self.requestline, code)

    def log_message(self, fmt: str, *args: object) -> None:
        """Protocol errors and idle keep-alive timeouts: not worth an access line."""
        logger.debug(fmt, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(app: App, host: str, port: int) -> None:
    """Bind now (so a busy port fails the start) and serve on a daemon thread."""
    server = (_Server6 if ":" in host else _Server)((host, port), Handler)
    server.app = app
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    logger.info("HTTP server listening on %s:%d", host, port)
