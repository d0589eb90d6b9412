"""A WebSocket client for the gateway's tests; prints one JSON line with what it saw.

    ws_client.py echo URL N        send N messages, check each echo
    ws_client.py many URL N        open N sockets one after another, keeping them all open;
                                   then close one and open one more
    ws_client.py denied URL        expect the upgrade to be refused: its status and headers
    ws_client.py abort URL         open, echo one message, then close the TCP socket without a
                                   close frame; prints the monotonic time of the close
    ws_client.py idle URL SECS     open and stay silent; how long until the gateway closes it
    ws_client.py busy URL SECS     open and send a message every 0.2 s for SECS seconds
"""

import json
import socket
import sys
import time

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect


def out(**fields):
    print(json.dumps(fields), flush=True)


def refused(e):
    r = e.response
    return {"status": r.status_code, "headers": {k.lower(): v for k, v in r.headers.raw_items()}}


def main():
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "echo":
        n = int(sys.argv[3])
        with connect(url, ping_interval=None) as ws:
            for i in range(n):
                ws.send(f"message {i}")
                got = ws.recv(timeout=10)
                if got != f"message {i}":
                    out(ok=False, got=got)
                    return
        out(ok=True, echoed=n)
    elif mode == "many":
        n = int(sys.argv[3])
        open_, failures = [], []
        for i in range(n):
            try:
                ws = connect(url, ping_interval=None, open_timeout=10)
                ws.send("hi")
                ws.recv(timeout=10)
                open_.append(ws)
            except InvalidStatus as e:
                failures.append(refused(e))
        # One closes; its slot is free for the next one.
        again = None
        if open_:
            open_.pop().close()
            time.sleep(0.3)
            try:
                ws = connect(url, ping_interval=None, open_timeout=10)
                ws.send("again")
                again = ws.recv(timeout=10) == "again"
                open_.append(ws)
            except InvalidStatus as e:
                again = refused(e)
        opened = len(open_)
        for ws in open_:
            ws.close()
        out(opened=opened, refused=failures, again=again)
    elif mode == "denied":
        try:
            with connect(url, ping_interval=None):
                out(upgraded=True)
        except InvalidStatus as e:
            out(upgraded=False, **refused(e))
    elif mode == "abort":
        ws = connect(url, ping_interval=None)
        ws.send("bye")
        ws.recv(timeout=10)
        t = time.monotonic()
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
        out(closed_at=t)
    elif mode == "idle":
        secs = float(sys.argv[3])
        with connect(url, ping_interval=None) as ws:
            start = time.monotonic()
            try:
                ws.recv(timeout=secs)
                out(closed_after=None, error="a message arrived")
            except TimeoutError:
                out(closed_after=None)
            except ConnectionClosed:
                out(closed_after=time.monotonic() - start)
    elif mode == "busy":
        secs = float(sys.argv[3])
        with connect(url, ping_interval=None) as ws:
            start, n = time.monotonic(), 0
            while time.monotonic() - start < secs:
                ws.send(f"{n}")
                if ws.recv(timeout=5) != f"{n}":
                    out(ok=False)
                    return
                n += 1
                time.sleep(0.2)
        out(ok=True, messages=n)
    else:
        sys.exit(f"unknown mode {mode}")


main()
