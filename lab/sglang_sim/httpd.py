"""HTTP plumbing: routes, the API keys, JSON and server-sent events over HTTP/1.1.

Keep-alive connections are closed after 5 idle seconds and access lines are
logged as uvicorn logs them under SGLang.

The keys are checked as SGLang's API key middleware checks them (0.5.9 and
0.5.23, ``sglang/srt/utils/auth.py``, ``decide_request_auth``), before any
route is looked up: an unknown path asks for ``--api-key`` too.
"""

import json
import logging
import secrets
import socket
import threading
from collections.abc import Callable, Collection, Generator, Mapping
from contextlib import closing
from dataclasses import dataclass
from email.message import Message
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# SGLang's API key middleware lets these through without a key, whatever the
# keys: probes and scrapes carry no secret. /ready is 0.5.23's (0.5.9 has no
# such route and asks a key of it; the simulator has none and answers 404).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class AuthLevel(Enum):
    """SGLang's auth level of a route (``@auth_level``; unmarked routes are NORMAL)."""

    # --api-key when set, even if --admin-api-key is set too.
    NORMAL = "normal"
    # --admin-api-key when set (--api-key is then refused), else --api-key when set.
    ADMIN_OPTIONAL = "admin_optional"


@dataclass(frozen=True)
class Keys:
    """The server's ``--api-key`` and ``--admin-api-key``; empty is unset, as in SGLang."""

    api_key: str | None = None
    admin_api_key: str | None = None

    def required(self, level: AuthLevel) -> str | None:
        """The key a request at ``level`` must show as its bearer token, if any."""
        if level is AuthLevel.ADMIN_OPTIONAL:
            return self.admin_api_key or self.api_key or None
        return self.api_key or None


def decide_request_auth(keys: Keys, level: AuthLevel, method: str, path: str,
                        authorization: str | None) -> bool:
    """
    Whether SGLang lets the request through: preflights and the open prefixes
    always, anything else when it needs no key or shows the right one.
    """
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return True
    expected = keys.required(level)
    return expected is None or bearer_matches(authorization, expected)


def bearer_matches(authorization: str | None, expected: str) -> bool:
    """
    ``Bearer <key>`` (the scheme in any case, one space), compared in constant
    time so that the answer's timing tells nothing about the key.
    """
    scheme, space, token = (authorization or "").partition(" ")
    if not space or scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(token.encode(), expected.encode())


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


# SGLang's refusal, as its middleware's ORJSONResponse writes it: compact JSON.
UNAUTHORIZED = Response(401, b'{"error":"Unauthorized"}')

Route = Callable[[Request], Response]


class App:
    """Routes by path and method, behind SGLang's API key middleware."""

    def __init__(self, routes: Mapping[str, Mapping[str, Route]], keys: Keys = Keys(),
                 admin_optional: Collection[str] = ()) -> None:
        self._routes = routes
        self._keys = keys
        self._admin_optional = admin_optional

    def respond(self, request: Request) -> Response:
        if not decide_request_auth(self._keys, self.auth_level(request), request.method,
                                   request.path, request.headers.get("Authorization")):
            return UNAUTHORIZED
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

    def auth_level(self, request: Request) -> AuthLevel:
        """
        The level of the route the request reaches; NORMAL for one it reaches
        none of (an unknown path, or a method the path does not take), as
        SGLang's middleware falls back to when Starlette finds no full match.
        """
        if (request.path in self._admin_optional
                and request.method in self._routes.get(request.path, {})):
            return AuthLevel.ADMIN_OPTIONAL
        return AuthLevel.NORMAL


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
