"""A WebSocket-over-HTTP/2 client (RFC 8441 extended CONNECT) for the gateway's tests, on
the `h2` package (hyper-h2) with WebSocket frames written and read here (RFC 6455 §5: a
client masks its frames). Prints one JSON line with what it saw.

URL is http://HOST:PORT/PATH (h2c, prior knowledge) or https://HOST:PORT/PATH (TLS, ALPN h2,
verified against the CA file given as CAFILE, for the name `localhost`).

    ws_h2_client.py echo URL CAFILE N [P]  one stream, N messages, each echoed (offering
                                           the subprotocols P, comma-separated)
    ws_h2_client.py many URL CAFILE N      N streams on ONE connection, one after another,
                                           all kept open; then every open one echoes again
                                           (a refusal did not harm them)
    ws_h2_client.py denied URL CAFILE      two streams: how each was answered
    ws_h2_client.py abort URL CAFILE       open, echo one message, reset the stream (the
                                           connection stays); the monotonic time of the reset
    ws_h2_client.py busy URL CAFILE SECS   one stream, a message every 0.2 s for SECS seconds
    ws_h2_client.py idle URL CAFILE SECS   one silent stream: how long until the gateway ends
                                           it (the stream, or the whole connection)
    ws_h2_client.py other URL CAFILE       a plain CONNECT and an extended CONNECT for another
                                           protocol: their statuses

CAFILE is `-` for h2c.
"""

import json
import os
import socket
import ssl
import struct
import sys
import time
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.settings


def out(**fields):
    print(json.dumps(fields), flush=True)


class Stream:
    def __init__(self):
        self.status = None
        self.headers = {}
        self.data = bytearray()
        self.ended = False
        self.reset = None


class Client:
    def __init__(self, url, cafile):
        u = urlsplit(url)
        self.authority = u.netloc
        self.scheme = u.scheme
        sock = socket.create_connection((u.hostname, u.port), timeout=10)
        if u.scheme == "https":
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.set_alpn_protocols(["h2"])
            sock = ctx.wrap_socket(sock, server_hostname="localhost")
            assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
        self.sock = sock
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.flush()
        self.streams = {}
        self.settings_seen = False
        self.pump(lambda: self.settings_seen)

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, done, timeout=10):
        """Reads frames until `done()` holds; False when the time ran out or the connection
        ended first."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return False
            if not data:
                return False
            for event in self.conn.receive_data(data):
                self.on(event)
            self.flush()
        return True

    def on(self, event):
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_seen = True
        s = self.streams.get(getattr(event, "stream_id", None))
        if s is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            h = dict(event.headers)
            s.status = int(h.pop(":status"))
            s.headers = h
        elif isinstance(event, h2.events.DataReceived):
            s.data.extend(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            s.ended = True
        elif isinstance(event, h2.events.StreamReset):
            s.reset = int(event.error_code)

    def connect_protocol_enabled(self):
        return self.conn.remote_settings.enable_connect_protocol == 1

    def open(self, path, protocol="websocket", subprotocols=None):
        """Sends an extended CONNECT; returns (stream id, Stream) once answered."""
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "CONNECT")]
        if protocol is not None:
            headers += [
                (":protocol", protocol),
                (":scheme", self.scheme),
                (":path", path),
            ]
        headers += [(":authority", self.authority)]
        if protocol == "websocket":
            headers += [("sec-websocket-version", "13")]
        if subprotocols:
            headers += [("sec-websocket-protocol", subprotocols)]
        s = self.streams[sid] = Stream()
        self.conn.send_headers(sid, headers)
        self.flush()
        self.pump(lambda: s.status is not None or s.reset is not None)
        return sid, s

    def send_text(self, sid, text):
        payload = text.encode()
        mask = os.urandom(4)
        assert len(payload) < 126
        frame = bytes([0x81, 0x80 | len(payload)]) + mask
        frame += bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.conn.send_data(sid, frame)
        self.flush()

    def recv_text(self, sid):
        """The next unmasked text frame of the stream, or None."""
        s = self.streams[sid]

        def frame():
            if len(s.data) < 2:
                return None
            n = s.data[1] & 0x7F
            assert n < 126 and not s.data[1] & 0x80, bytes(s.data[:2])
            if len(s.data) < 2 + n:
                return None
            return n

        if not self.pump(lambda: frame() is not None or s.ended or s.reset is not None):
            return None
        n = frame()
        if n is None:
            return None
        opcode = s.data[0] & 0x0F
        payload = bytes(s.data[2 : 2 + n])
        del s.data[: 2 + n]
        return payload.decode() if opcode == 1 else None

    def echo(self, sid, text):
        self.send_text(sid, text)
        return self.recv_text(sid) == text


def answer(s):
    return {"status": s.status, "reset": s.reset, "headers": s.headers}


def main():
    mode, url, cafile = sys.argv[1], sys.argv[2], sys.argv[3]
    path = urlsplit(url).path
    c = Client(url, None if cafile == "-" else cafile)
    if not c.connect_protocol_enabled():
        out(ok=False, error="the server did not send SETTINGS_ENABLE_CONNECT_PROTOCOL = 1")
        return
    if mode == "echo":
        n = int(sys.argv[4])
        sid, s = c.open(path, subprotocols=sys.argv[5] if len(sys.argv) > 5 else None)
        if s.status != 200:
            out(ok=False, **answer(s))
            return
        for i in range(n):
            if not c.echo(sid, f"message {i}"):
                out(ok=False, at=i)
                return
        out(ok=True, echoed=n, **answer(s))
    elif mode == "many":
        n = int(sys.argv[4])
        opened, refused = [], []
        for i in range(n):
            sid, s = c.open(path)
            if s.status == 200 and c.echo(sid, f"hi {i}"):
                opened.append(sid)
            else:
                refused.append(answer(s))
        still = all(c.echo(sid, f"again {sid}") for sid in opened)
        out(opened=len(opened), refused=refused, still_echo=still)
    elif mode == "denied":
        answers = [answer(c.open(path)[1]) for _ in range(2)]
        out(answers=answers)
    elif mode == "abort":
        sid, s = c.open(path)
        ok = s.status == 200 and c.echo(sid, "bye")
        t = time.monotonic()
        c.conn.reset_stream(sid)
        c.flush()
        # The connection stays open while the upstream is watched.
        time.sleep(3)
        out(ok=ok, closed_at=t)
    elif mode == "busy":
        secs = float(sys.argv[4])
        sid, s = c.open(path)
        start, n = time.monotonic(), 0
        while s.status == 200 and time.monotonic() - start < secs:
            if not c.echo(sid, f"{n}"):
                out(ok=False, messages=n, after=time.monotonic() - start, **answer(s))
                return
            n += 1
            time.sleep(0.2)
        out(ok=s.status == 200, messages=n)
    elif mode == "idle":
        secs = float(sys.argv[4])
        sid, s = c.open(path)
        start = time.monotonic()
        ended = c.pump(lambda: s.ended or s.reset is not None, timeout=secs)
        # A connection closed under the stream ends it too (pump returns False early).
        after = time.monotonic() - start
        out(status=s.status, closed_after=after if ended or after < secs else None)
    elif mode == "other":
        plain = answer(c.open(None, protocol=None)[1])
        other = answer(c.open(path, protocol="connect-udp")[1])
        out(plain=plain, other=other)
    else:
        sys.exit(f"unknown mode {mode}")


main()
