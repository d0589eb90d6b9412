"""A WebSocket echo server for the gateway's tests.

Listens on 127.0.0.1 (a port the OS picks), prints `PORT <n>` once ready, then one line per
event, each with a monotonic timestamp in seconds: `OPEN <path> <t>` when a connection
opens and `CLOSED <path> <t>` when it ends (however it ended). Echoes every message back.
Runs until stdin closes. `ws_server.py A,B` accepts the subprotocols A and B.
"""

import asyncio
import sys
import time

from websockets.asyncio.server import serve


def say(*words):
    print(*words, flush=True)


async def echo(ws):
    path = ws.request.path
    say("OPEN", path, f"{time.monotonic():.3f}")
    try:
        async for message in ws:
            await ws.send(message)
    except Exception:
        pass
    finally:
        say("CLOSED", path, f"{time.monotonic():.3f}")


async def main():
    # Optional: the subprotocols it accepts (the first the client offers that it knows).
    subprotocols = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    async with serve(
        echo, "127.0.0.1", 0, ping_interval=None, subprotocols=subprotocols
    ) as server:
        port = server.sockets[0].getsockname()[1]
        say("PORT", port)
        loop = asyncio.get_running_loop()
        # Until the test closes stdin.
        await loop.run_in_executor(None, sys.stdin.read)


asyncio.run(main())
