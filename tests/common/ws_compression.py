"""Python `websockets` (PyPI, pinned in scripts/test.sh) as a ringcast subscriber with
permessage-deflate: tests/compression.rs runs it. Argument: the WebSocket URL.

Prints one JSON line per step: the negotiated extension (name and parameters), "ready"
once subscribed to `big` and a compressed 4 KB ping was answered, then the first
message received on `big`, then exits.
"""
import asyncio
import json
import sys

from websockets.asyncio.client import connect


def say(obj):
    print(json.dumps(obj), flush=True)


async def main(url):
    # compression="deflate" is the default; every message it sends is compressed.
    async with connect(url, compression="deflate", max_size=2**20) as ws:
        ext = [(e.name, getattr(e, "remote_no_context_takeover", None)) for e in ws.protocol.extensions]
        say({"extensions": [e.name for e in ws.protocol.extensions],
             "server_no_context_takeover": [x[1] for x in ext]})
        frames = []

        async def until(pred):
            while True:
                f = json.loads(await ws.recv())
                frames.append(f)
                if pred(f):
                    return f

        await until(lambda f: f.get("type") == "connected")
        await ws.send(json.dumps({"type": "subscribe", "channel": "big"}))
        await until(lambda f: f.get("type") == "subscribed")
        await ws.send(json.dumps({"type": "ping", "pad": "z" * 4000}))
        pong = await until(lambda f: f.get("type") in ("pong", "error"))
        say({"ready": pong.get("type")})
        msg = await until(lambda f: f.get("type") == "message")
        say({"message": msg})


asyncio.run(main(sys.argv[1]))
