#!/usr/bin/env python3
"""Drive Pusher's Python server SDK (PyPI `pusher`, pinned to 3.3.4 in scripts/test.sh)
against a running ringcast, for tests/pusher_sdk.rs.

Usage: pusher_sdk.py HOST PORT APP_ID KEY SECRET

The client is made exactly as an application would make it for Pusher, pointed at
ringcast: pusher.Pusher(app_id, key, secret, host, port, ssl=False). Then each line on
stdin is one call, a JSON object {"call": NAME, "args": [...], "kwargs": {...}} naming a
method of that client (trigger, trigger_batch, channels_info, channel_info, users_info,
authenticate, ...), and each call prints one JSON line on stdout:
{"ok": <what the SDK returned>} or {"error": <exception class>, "message": <text>}.
Driven line by line, so the Rust side can set up WebSocket clients between calls.
"""
import json
import sys

import pusher


def main():
    host, port, app_id, key, secret = sys.argv[1:6]
    client = pusher.Pusher(
        app_id=app_id, key=key, secret=secret, host=host, port=int(port), ssl=False
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            method = getattr(client, req["call"])
            out = {"ok": method(*req.get("args", []), **req.get("kwargs", {}))}
        except Exception as e:  # every SDK error is an answer for the test to check
            out = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
