"""The agent's local API (docs/component-protocol.md), for one component: the requests the context
makes. Standard library only; the component's token (TOA_AGENT_TOKEN, or the file
TOA_AGENT_TOKEN_FILE names, read for each request) goes with every request."""

import http.client
import json
import os
import socket
import urllib.parse

from .errors import CallError


class Agent:
    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        url = urllib.parse.urlparse(environ["TOA_AGENT"])
        self.host, self.port = url.hostname, url.port
        self.component = environ["TOA_COMPONENT"]
        self.instance = environ.get("TOA_INSTANCE", "")
        self._token = environ.get("TOA_AGENT_TOKEN")
        self._token_file = environ.get("TOA_AGENT_TOKEN_FILE")

    def headers(self):
        headers = {"content-type": "application/json"}
        token = self._token
        if token is None and self._token_file:
            with open(self._token_file) as file:
                token = file.read().strip()
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    def connect(self, timeout=None):
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def request(self, method, path, body=None, timeout=120):
        """The answer's status and JSON value."""
        connection = self.connect(timeout)
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, payload, self.headers())
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            connection.close()

    def checked(self, method, path, body=None):
        status, value = self.request(method, path, body)
        if status >= 400:
            raise CallError((value or {}).get("error", {"code": str(status)}))
        return value

    def stream(self, method, path, body=None):
        """An open stream (newline-delimited JSON): the connection and the response."""
        connection = self.connect()
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, payload, self.headers())
        response = connection.getresponse()
        if response.status != 200:
            error = json.loads(response.read() or b"{}").get("error", {})
            connection.close()
            raise CallError(error)
        return connection, response

    def own(self, route):
        return f"/v1/{self.component}/{route}"
