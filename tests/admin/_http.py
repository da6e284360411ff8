"""Plain HTTP requests to a test server's admin port (the standard library's client)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, NamedTuple

__all__ = ["Response", "get_json", "request"]


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, method: str = "GET", timeout: float = 10.0) -> Response:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return Response(reply.status, reply.headers.get("Content-Type", ""), reply.read())
    except urllib.error.HTTPError as error:
        return Response(error.code, error.headers.get("Content-Type", ""), error.read())


def get_json(url: str) -> Any:
    response = request(url)
    assert response.status == 200, response
    assert response.content_type == "application/json", response.content_type
    return response.json()
