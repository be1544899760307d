"""A minimal application backend that signs private-channel tokens for its logged-in user.

    RINGCAST_TOKEN_SECRET=ts_... python3 examples/token_endpoint.py [PORT]

The browser's ringcast client calls `getToken(channel)`; point it at this endpoint:

    getToken: async (channel) =>
      (await (await fetch(`/ringcast/token?channel=${encodeURIComponent(channel)}`,
                          {credentials: "include"})).json()).token

A user may subscribe only to their own channels: `private-user-<their id>` (and
`private-user-<their id>-...`). Anything else is 403. The token is a JWT signed with
HS256 and the project's token secret (`ringcast project create` prints it once as
"token_secret"), naming the channel, the user in `sub`, and expiring in TOKEN_TTL_S.

"Logged in" is stood in for by a session cookie `session=<user id>`, or the header
`X-User: <user id>`: replace `current_user` with your framework's session lookup.
Needs PyJWT (`pip install pyjwt`). Prints `listening on http://127.0.0.1:PORT` once ready.
"""

import json
import os
import sys
import time
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import jwt  # PyJWT

SECRET = os.environ["RINGCAST_TOKEN_SECRET"]
TOKEN_TTL_S = int(os.environ.get("TOKEN_TTL_S", "300"))


def current_user(handler):
    """The logged-in user's id, or None. Replace with your session lookup."""
    cookie = SimpleCookie(handler.headers.get("Cookie", ""))
    if "session" in cookie and cookie["session"].value:
        return cookie["session"].value
    return handler.headers.get("X-User") or None


def may_subscribe(user, channel):
    own = f"private-user-{user}"
    return channel == own or channel.startswith(own + "-")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        if url.path != "/ringcast/token":
            return self.answer(404, {"error": "not found"})
        user = current_user(self)
        if user is None:
            return self.answer(401, {"error": "log in first"})
        channel = parse_qs(url.query).get("channel", [""])[0]
        if not may_subscribe(user, channel):
            return self.answer(403, {"error": "not your channel"})
        now = int(time.time())
        token = jwt.encode(
            {"channel": channel, "sub": user, "iat": now, "exp": now + TOKEN_TTL_S},
            SECRET,
            algorithm="HS256",
        )
        self.answer(200, {"token": token, "exp": now + TOKEN_TTL_S})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass  # never log tokens


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
