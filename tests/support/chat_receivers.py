"""Local stand-ins for a Slack and a Microsoft Teams incoming webhook: each checks the message
shape its platform documents and answers as the platform does (Slack: 200 `ok`, or 400
`invalid_payload`; Teams Workflows: 202, or 400), after any scripted failures."""

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLACK_BLOCK_TYPES = {"header", "section", "context", "divider", "actions", "image", "rich_text"}
ADAPTIVE_ELEMENT_TYPES = {"TextBlock", "FactSet", "ColumnSet", "Container", "Image", "RichTextBlock"}


def check_slack_shape(body: Any) -> None:
    """Slack's incoming-webhook message: a non-empty `text` (the fallback Slack asks for even with
    blocks) and, if present, well-formed Block Kit `blocks` (at most 50; header plain_text <= 150
    characters; section text <= 3000; context 1..10 elements)."""
    assert isinstance(body, dict), "not a JSON object"
    assert isinstance(body.get("text"), str) and body["text"].strip(), "no fallback text"
    blocks = body.get("blocks", [])
    assert isinstance(blocks, list) and len(blocks) <= 50, "blocks is not a list of at most 50"
    for block in blocks:
        assert block.get("type") in SLACK_BLOCK_TYPES, f"unknown block {block.get('type')}"
        if block["type"] == "header":
            text = block["text"]
            assert text["type"] == "plain_text" and 0 < len(text["text"]) <= 150, "bad header"
        if block["type"] == "section":
            text = block["text"]
            assert text["type"] in ("mrkdwn", "plain_text") and 0 < len(text["text"]) <= 3000, "bad section"
        if block["type"] == "context":
            elements = block["elements"]
            assert 1 <= len(elements) <= 10 and all(e["type"] in ("mrkdwn", "plain_text", "image") for e in elements)


def check_teams_shape(body: Any) -> None:
    """A Teams Workflows webhook message: `type: message` with one Adaptive Card attachment."""
    assert isinstance(body, dict) and body.get("type") == "message", "not a message"
    attachments = body.get("attachments")
    assert isinstance(attachments, list) and len(attachments) == 1, "not one attachment"
    attachment = attachments[0]
    assert attachment.get("contentType") == "application/vnd.microsoft.card.adaptive", "not an Adaptive Card"
    card = attachment["content"]
    assert card.get("type") == "AdaptiveCard" and card.get("version") == "1.4", "not an Adaptive Card 1.4"
    assert card.get("$schema") == "http://adaptivecards.io/schemas/adaptive-card.json", "no $schema"
    assert card.get("body") and all(e.get("type") in ADAPTIVE_ELEMENT_TYPES for e in card["body"]), "bad body"
    for element in card["body"]:
        if element["type"] == "TextBlock":
            assert isinstance(element.get("text"), str) and element["text"], "empty TextBlock"
        if element["type"] == "FactSet":
            assert all(set(f) == {"title", "value"} for f in element["facts"]), "bad FactSet"
    for action in card.get("actions", []):
        assert action.get("type") == "Action.OpenUrl" and action.get("title"), "bad action"
        assert str(action.get("url", "")).startswith(("https://", "http://")), "bad action url"


@dataclass
class ChatReceiver:
    """Answers `failures` (statuses) in turn, then as the platform: `ok_status`/`ok_body` for a
    well-formed message, 400 `invalid_payload` otherwise. Records every request."""

    check: Callable[[Any], None]
    ok_status: int
    ok_body: str
    port: int = 0
    failures: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/services/T000/B000/XXXX"

    def answer(self, raw: bytes) -> tuple[int, str, str | None]:
        """(status, body, why the shape is wrong or None)"""
        try:
            self.check(json.loads(raw))
        except (ValueError, AssertionError, KeyError, TypeError) as exc:
            return 400, "invalid_payload", str(exc) or type(exc).__name__
        with self.lock:
            if self.failures:
                return self.failures.pop(0), "", None
        return self.ok_status, self.ok_body, None


def _handler(rec: ChatReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            status, answer, problem = rec.answer(raw)
            with rec.lock:
                rec.requests.append(
                    {
                        "at": time.time(),
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": raw,
                        "answered": status,
                        "problem": problem,
                    }
                )
            payload = answer.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(rec: ChatReceiver) -> Iterator[ChatReceiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    server.daemon_threads = True
    rec.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


def slack_receiver() -> ChatReceiver:
    return ChatReceiver(check_slack_shape, 200, "ok")


def teams_receiver() -> ChatReceiver:
    return ChatReceiver(check_teams_shape, 202, "")
