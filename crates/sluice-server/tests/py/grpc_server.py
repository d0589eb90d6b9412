"""A gRPC server for the gateway's tests, with raw-bytes messages (no protoc needed).

Listens on 127.0.0.1 (a port the OS picks) and prints `PORT <n>` once ready. Runs until
stdin closes.

- /test.Echo/Unary: answers with the request bytes, and the trailing metadata
  `x-trailer: unary-done`.
- /test.Echo/Stream: the request is a count N; answers `msg 0` .. `msg N-1`, 0.3 s apart,
  then the trailing metadata `x-trailer: stream-done`.
- /test.Echo/Chat: bidirectional; answers each request message with `echo <message>` as
  soon as it arrives.
"""

import sys
import time
from concurrent import futures

import grpc


def unary(request, context):
    context.set_trailing_metadata((("x-trailer", "unary-done"),))
    return request


def stream(request, context):
    for i in range(int(request)):
        if i:
            time.sleep(0.3)
        yield f"msg {i}".encode()
    context.set_trailing_metadata((("x-trailer", "stream-done"),))


def chat(requests, context):
    for message in requests:
        yield b"echo " + message


class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method == "/test.Echo/Unary":
            return grpc.unary_unary_rpc_method_handler(unary)
        if details.method == "/test.Echo/Stream":
            return grpc.unary_stream_rpc_method_handler(stream)
        if details.method == "/test.Echo/Chat":
            return grpc.stream_stream_rpc_method_handler(chat)
        return None


server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
server.add_generic_rpc_handlers((Handler(),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print("PORT", port, flush=True)
sys.stdin.read()
server.stop(0)
