"""A gRPC client for the gateway's tests (raw-bytes messages); prints one JSON line.

    grpc_client.py unary TARGET          one unary call: the reply and the trailing metadata
    grpc_client.py stream TARGET N       a server-streaming call of N messages: when each
                                         arrived (seconds since the call) and the trailers
    grpc_client.py chat TARGET N         a bidirectional call that sends message i only once the
                                         answer to message i-1 is back: the answers, the code
    grpc_client.py call TARGET           one unary call: its status code, details and the
                                         metadata of a failure
    grpc_client.py retry TARGET          a probe call that is refused (its pushback), then a
                                         call on a channel whose service config retries
                                         RESOURCE_EXHAUSTED: whether it succeeded, and after
                                         how long
"""

import json
import queue
import sys
import time

import grpc


def out(**fields):
    print(json.dumps(fields), flush=True)


def metadata(md):
    return {k: v for k, v in (md or ())}


RETRY_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "test.Echo"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                },
            }
        ]
    }
)


def unary_call(channel, timeout=10):
    return channel.unary_unary("/test.Echo/Unary").with_call(b"hello", timeout=timeout)


def main():
    mode, target = sys.argv[1], sys.argv[2]
    if mode == "unary":
        with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as ch:
            reply, call = unary_call(ch)
            out(reply=reply.decode(), trailers=metadata(call.trailing_metadata()),
                code=call.code().name)
    elif mode == "stream":
        n = int(sys.argv[3])
        with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as ch:
            start = time.monotonic()
            call = ch.unary_stream("/test.Echo/Stream")(str(n).encode(), timeout=30)
            got = []
            for message in call:
                got.append([message.decode(), time.monotonic() - start])
            out(messages=got, trailers=metadata(call.trailing_metadata()),
                code=call.code().name)
    elif mode == "chat":
        n = int(sys.argv[3])
        outbox = queue.Queue()

        def requests():
            while True:
                message = outbox.get()
                if message is None:
                    return
                yield message

        with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as ch:
            call = ch.stream_stream("/test.Echo/Chat")(requests(), timeout=10)
            got = []
            try:
                outbox.put(b"m0")
                for answer in call:
                    got.append(answer.decode())
                    outbox.put(f"m{len(got)}".encode() if len(got) < n else None)
                out(answers=got, code=call.code().name)
            except grpc.RpcError as e:
                outbox.put(None)
                out(answers=got, code=e.code().name, details=e.details())
    elif mode == "call":
        with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as ch:
            try:
                reply, call = unary_call(ch)
                out(code="OK", reply=reply.decode())
            except grpc.RpcError as e:
                out(code=e.code().name, details=e.details(),
                    trailers=metadata(e.trailing_metadata()),
                    initial=metadata(e.initial_metadata()))
    elif mode == "retry":
        with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as ch:
            probed = time.monotonic()
            try:
                unary_call(ch)
                out(error="the probe was admitted")
                return
            except grpc.RpcError as e:
                md = metadata(e.trailing_metadata())
                pushback = int(md.get("grpc-retry-pushback-ms", "-1"))
                code = e.code().name
        options = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY_CONFIG)]
        with grpc.insecure_channel(target, options=options) as ch:
            grpc.channel_ready_future(ch).result(timeout=10)
            start = time.monotonic()
            try:
                reply, call = unary_call(ch, timeout=30)
                result = "OK"
            except grpc.RpcError as e:
                result = e.code().name
            elapsed = time.monotonic() - start
        # What was left of the pushback when the retrying call started.
        left = pushback / 1000 - (start - probed)
        out(probe=code, pushback_ms=pushback, result=result, elapsed_ms=elapsed * 1000,
            left_ms=left * 1000)
    else:
        sys.exit(f"unknown mode {mode}")


main()
