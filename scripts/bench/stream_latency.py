#!/usr/bin/env python3
"""Time to first byte and per-chunk latency of a server-sent event stream through a gateway.

    stream_latency.py upstream PORT
        Serves, on 127.0.0.1:PORT, an OpenAI-style event stream to every GET: `events` events
        (query parameter, default 40), one every `gap_ms` (default 5) milliseconds, each
        carrying the time it was written (CLOCK_REALTIME, ns), then a usage event and
        `[DONE]`, chunked HTTP/1.1 with keep-alive.

    stream_latency.py client URL STREAMS
        Opens STREAMS streams one after the other (over one keep-alive connection) from URL and
        prints one JSON line: the median and p99 of the time to first byte (request written to
        first body byte), and of each event's latency (received minus written: what the
        gateway added, plus the loopback, as both ends share the machine's clock).

Only the standard library: the same client and upstream for every gateway measured.
"""

import asyncio
import json
import statistics
import sys
import time
from urllib.parse import parse_qs, urlsplit


def event(payload: dict) -> bytes:
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1].decode()
            query = parse_qs(urlsplit(target).query)
            events = int(query.get("events", ["40"])[0])
            gap = int(query.get("gap_ms", ["5"])[0]) / 1000
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for i in range(events):
                writer.write(
                    event(
                        {
                            "choices": [{"delta": {"content": f"word {i}"}}],
                            "usage": None,
                            "sent_ns": time.clock_gettime_ns(time.CLOCK_REALTIME),
                        }
                    )
                )
                await writer.drain()
                await asyncio.sleep(gap)
            writer.write(event({"choices": [], "usage": {"total_tokens": events}}))
            data = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def upstream(port: int) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
    if size == 0:
        await reader.readuntil(b"\r\n")
        return b""
    data = await reader.readexactly(size)
    await reader.readexactly(2)
    return data


async def client(url: str, streams: int) -> None:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    target = parts.path + ("?" + parts.query if parts.query else "")
    request = (
        f"GET {target} HTTP/1.1\r\nhost: {parts.netloc}\r\nx-api-key: bench\r\n\r\n"
    ).encode()
    first_bytes, chunks = [], []
    for _ in range(streams):
        sent = time.perf_counter_ns()
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"{url}: {head.decode(errors='replace')}")
        chunked = b"transfer-encoding: chunked" in head.lower()
        if not chunked:
            raise SystemExit(f"{url}: not chunked: {head.decode(errors='replace')}")
        pending = b""
        first = True
        while True:
            data = await read_chunk(reader)
            if not data:
                break
            now_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
            if first:
                first_bytes.append((time.perf_counter_ns() - sent) / 1e6)
                first = False
            pending += data
            while b"\n\n" in pending:
                line, pending = pending.split(b"\n\n", 1)
                if b'"sent_ns"' in line:
                    sent_ns = json.loads(line[len(b"data: "):])["sent_ns"]
                    chunks.append((now_ns - sent_ns) / 1e6)
    writer.close()

    def p99(values):
        return statistics.quantiles(values, n=100)[98]

    print(
        json.dumps(
            {
                "streams": streams,
                "ttfb_ms_median": round(statistics.median(first_bytes), 3),
                "ttfb_ms_p99": round(p99(first_bytes), 3),
                "chunk_ms_median": round(statistics.median(chunks), 3),
                "chunk_ms_p99": round(p99(chunks), 3),
                "chunks": len(chunks),
            }
        )
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "upstream":
        asyncio.run(upstream(int(sys.argv[2])))
    elif len(sys.argv) == 4 and sys.argv[1] == "client":
        asyncio.run(client(sys.argv[2], int(sys.argv[3])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
