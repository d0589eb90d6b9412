"""An Envoy rate limit service client for the tests: Envoy's own request and response
messages (envoy-data-plane, betterproto2) over grpcio's channel, as Envoy's rate_limit filter
sends them.

    rls_client.py HOST:PORT < PLAN.json

PLAN is a JSON list of calls, each
    {"domain": "edge", "descriptors": [[["remote_address", "1.2.3.4"], ...], ...],
     "hits_addend": 0, "descriptor_hits": [null, 3, ...], "repeat": 1}
Each call is sent `repeat` times in a row, or, with "for_seconds": S, again and again for S
seconds; with "summary": true one line sums its answers up:
    {"call": I, "ok": N, "over_limit": M, "first_sent": UNIX_S, "last_answered": UNIX_S}
Otherwise one JSON line per answer is printed:
    {"call": I, "overall_code": "OK"|"OVER_LIMIT", "statuses": [{"code", "limit":
     {"name", "requests_per_unit", "unit"} or null, "remaining", "reset_ms"}...],
     "headers": {"ratelimit": ...}}
"""

import json
import sys
import time

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitServiceSyncStub,
)


def enum_name(value):
    return getattr(value, "name", str(value))


def descriptor(entries, hits):
    d = RateLimitDescriptor(
        entries=[RateLimitDescriptorEntry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend = hits
    return d


def answer(i, response):
    statuses = []
    for s in response.statuses:
        limit = None
        if s.current_limit is not None:
            limit = {
                "name": s.current_limit.name,
                "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": enum_name(s.current_limit.unit),
            }
        reset = s.duration_until_reset
        reset_ms = None
        if reset is not None:
            reset_ms = reset.total_seconds() * 1000
        statuses.append(
            {
                "code": enum_name(s.code),
                "limit": limit,
                "remaining": s.limit_remaining,
                "reset_ms": reset_ms,
            }
        )
    headers = {h.key: h.value for h in response.response_headers_to_add}
    return {
        "call": i,
        "overall_code": enum_name(response.overall_code),
        "statuses": statuses,
        "headers": headers,
    }


def main():
    target = sys.argv[1]
    plan = json.load(sys.stdin)
    with grpc.insecure_channel(target) as channel:
        stub = RateLimitServiceSyncStub(channel)
        for i, call in enumerate(plan):
            hits = call.get("descriptor_hits") or [None] * len(call["descriptors"])
            request = RateLimitRequest(
                domain=call["domain"],
                descriptors=[
                    descriptor(entries, h)
                    for entries, h in zip(call["descriptors"], hits)
                ],
                hits_addend=call.get("hits_addend", 0),
            )
            counts = {"OK": 0, "OVER_LIMIT": 0}
            first_sent = time.time()
            until = first_sent + call.get("for_seconds", 0)
            sent = 0
            while sent < call.get("repeat", 1) or time.time() < until:
                response = stub.should_rate_limit(request)
                sent += 1
                a = answer(i, response)
                if call.get("summary"):
                    counts[a["overall_code"]] += 1
                else:
                    print(json.dumps(a), flush=True)
            if call.get("summary"):
                print(
                    json.dumps(
                        {
                            "call": i,
                            "ok": counts["OK"],
                            "over_limit": counts["OVER_LIMIT"],
                            "first_sent": first_sent,
                            "last_answered": time.time(),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
