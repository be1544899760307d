#!/usr/bin/env python3
"""Publish one message to ringcast from a Python backend.

    pip install requests
    RINGCAST_KEY=sk_... python3 examples/publish.py news order.created '{"id": 42}'

Environment: RINGCAST_URL (default http://127.0.0.1:8080) and RINGCAST_KEY (a secret
key, sk_...). Arguments: CHANNEL EVENT DATA, DATA being JSON text (an object or a string);
by default "news", "order.created", {"id": 42}. Prints the answer and exits 0 on 202.
"""

import json
import os
import sys

import requests


def publish(base_url, secret_key, channel, event, data):
    """POST /api/v1/publish; returns the requests.Response."""
    return requests.post(
        f"{base_url.rstrip('/')}/api/v1/publish",
        headers={"X-Api-Key": secret_key},  # json= sets Content-Type: application/json
        json={"channel": channel, "event": event, "data": data},
        timeout=10,
    )


def main():
    base_url = os.environ.get("RINGCAST_URL", "http://127.0.0.1:8080")
    secret_key = os.environ.get("RINGCAST_KEY")
    if not secret_key:
        sys.exit("set RINGCAST_KEY to a secret key (sk_...)")
    args = sys.argv[1:]
    channel = args[0] if len(args) > 0 else "news"
    event = args[1] if len(args) > 1 else "order.created"
    data = json.loads(args[2]) if len(args) > 2 else {"id": 42}

    response = publish(base_url, secret_key, channel, event, data)
    print(response.status_code, response.text)
    if response.status_code == 429:
        print(f"over quota: retry after {response.headers.get('Retry-After')} s", file=sys.stderr)
    sys.exit(0 if response.status_code == 202 else 1)


if __name__ == "__main__":
    main()
