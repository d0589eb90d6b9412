//! The byte path beside hyper's: the same bytes sent to a gateway with `byte_path = true` and
//! to one with `byte_path = false`, in front of one scripted upstream that answers each path
//! with raw bytes of its own (lengths, chunks with extensions and trailers, a body read to the
//! close, `1xx`, `204`, `304`, hop-by-hop fields, odd reason phrases, broken framings).
//!
//! For every case, what the upstream received (each request's head and body) and what the
//! client received (status lines, fields, bodies decoded, and whether the connection closed)
//! must be the same on both. The byte-path gateway's `sluice_byte_path_requests_total` shows
//! which of them it served itself: the comparison would prove nothing for requests it handed
//! to hyper. `cargo test -p sluice-server --test byte_path -- --nocapture` prints the table.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{metric, Gateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the upstream received: each request's head and body, in arrival order.
type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// The fixed date of the scripted answers.
const DATE: &str = "date: Thu, 01 Jan 2026 00:00:00 GMT\r\n";

/// The raw answer to a request for `/api/r/NAME` (and `HEAD`): `None` closes the connection
/// without one. The connection closes after answers framed by the close.
fn script(path: &str, head: bool) -> Option<Vec<u8>> {
    let name = path
        .rsplit('/')
        .next()
        .unwrap_or("")
        .split('?')
        .next()
        .unwrap_or("");
    let text: String = match name {
        _ if head => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 5\r\n\r\n"),
        "chunked" => format!("HTTP/1.1 200 OK\r\n{DATE}transfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n"),
        "close" => format!("HTTP/1.1 200 OK\r\n{DATE}\r\nuntil the close"),
        "nocontent" => format!("HTTP/1.1 204 No Content\r\n{DATE}x-a: 1\r\n\r\n"),
        "notmodified" => format!("HTTP/1.1 304 Not Modified\r\n{DATE}etag: \"v1\"\r\n\r\n"),
        "continue" => format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n{DATE}content-length: 2\r\n\r\nok"),
        "hop" => format!("HTTP/1.1 200 OK\r\n{DATE}connection: x-up-secret, keep-alive\r\nx-up-secret: 1\r\nkeep-alive: timeout=5\r\nproxy-authenticate: basic\r\ntrailer: x-t\r\nx-kept: yes\r\ncontent-length: 2\r\n\r\nok"),
        "reason" => format!("HTTP/1.1 200 Fine By Me\r\n{DATE}content-length: 2\r\n\r\nok"),
        "unknown" => format!("HTTP/1.1 599 Custom\r\n{DATE}content-length: 0\r\n\r\n"),
        "ratelimit" => format!("HTTP/1.1 200 OK\r\n{DATE}ratelimit: \"up\";r=1;t=1\r\nratelimit-policy: \"up\";q=2;w=1\r\nx-request-id: up-id\r\ncontent-length: 2\r\n\r\nok"),
        "garbage" => "NOT HTTP AT ALL\r\n\r\n".to_owned(),
        "drop" => return None,
        // HTTP/1.0 whose first `Connection` says close (a later keep-alive undoes nothing):
        // `serve_upstream` keeps the connection a moment, marking what still comes on it.
        "close10" => format!("HTTP/1.0 200 OK\r\n{DATE}connection: close\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok"),
        // Half the promised body, then the close.
        "cut" => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 10\r\n\r\nhello"),
        // The head at once, the body a second later (`serve_upstream` waits).
        "slowbody" => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 5\r\n\r\nhello"),
        "dupcl" => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 2\r\ncontent-length: 2\r\n\r\nok"),
        "badcl" => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 2\r\ncontent-length: 3\r\n\r\nok!"),
        "clte" => format!("HTTP/1.1 200 OK\r\n{DATE}content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
        // An OpenAI-style event stream, chunked, its usage in the last event before
        // `[DONE]`; and a chunked answer whose cost is in a trailer.
        "sse" => {
            let events = [
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
                "data: {\"choices\":[],\"usage\":{\"total_tokens\":42}}\n\n",
                "data: [DONE]\n\n",
            ];
            let chunks: String = events
                .iter()
                .map(|e| format!("{:x}\r\n{e}\r\n", e.len()))
                .collect();
            format!("HTTP/1.1 200 OK\r\n{DATE}content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{chunks}0\r\n\r\n")
        }
        "costtrailer" => format!("HTTP/1.1 200 OK\r\n{DATE}transfer-encoding: chunked\r\ntrailer: x-cost\r\n\r\n2\r\nok\r\n0\r\nx-cost: 7\r\n\r\n"),
        "badchunk" => format!("HTTP/1.1 200 OK\r\n{DATE}transfer-encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"),
        "big" => {
            let body = "b".repeat(100_000);
            format!("HTTP/1.1 200 OK\r\n{DATE}content-length: {}\r\n\r\n{body}", body.len())
        }
        "bigchunked" => {
            let chunk = "c".repeat(40_000);
            format!("HTTP/1.1 200 OK\r\n{DATE}transfer-encoding: chunked\r\n\r\n9c40\r\n{chunk}\r\n9c40\r\n{chunk}\r\n9c40\r\n{chunk}\r\n0\r\n\r\n")
        }
        _ => format!("HTTP/1.1 200 OK\r\n{DATE}content-type: text/plain\r\ncontent-length: 5\r\n\r\nhello"),
    };
    Some(text.into_bytes())
}

/// The scripted upstream.
async fn upstream(seen: Seen) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve_upstream(stream, Arc::clone(&seen)));
        }
    });
    port
}

async fn serve_upstream(mut stream: TcpStream, seen: Seen) {
    let mut buf = Vec::new();
    // An answer said the connection closes: a request that still comes on it was sent to a
    // connection the upstream meant to close (one that would have closed it at once would
    // have lost the request).
    let mut closing = false;
    loop {
        let read = read_request(&mut stream, &mut buf);
        let read = if closing {
            match tokio::time::timeout(Duration::from_secs(1), read).await {
                Ok(read) => read,
                Err(_) => return,
            }
        } else {
            read.await
        };
        let Some((mut head, body)) = read else {
            return;
        };
        if closing {
            head.insert_str(0, "(after the upstream said close) ");
        }
        let request_line = head.lines().next().unwrap_or("").to_owned();
        let request_line = request_line
            .strip_prefix("(after the upstream said close) ")
            .unwrap_or(&request_line)
            .to_owned();
        let is_head = request_line.starts_with("HEAD ");
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        seen.lock().unwrap().push((head, body));
        let Some(answer) = script(&path, is_head) else {
            return;
        };
        let (head, body) = match find(&answer, b"\r\n\r\n") {
            Some(end) if path.ends_with("/slowbody") => answer.split_at(end + 4),
            _ => (&answer[..], &[][..]),
        };
        if stream.write_all(head).await.is_err() {
            return;
        }
        if !body.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if stream.write_all(body).await.is_err() {
                return;
            }
        }
        if path.ends_with("/close") || path.ends_with("/cut") {
            return;
        }
        closing |= path.ends_with("/close10");
    }
}

/// One request: its head as text and its body (by `Content-Length`, or chunked).
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let end = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at + 4;
        }
        fill(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end);
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if lower.contains("\r\ntransfer-encoding: chunked") {
        loop {
            let line = loop {
                if let Some(at) = find(buf, b"\r\n") {
                    break at;
                }
                fill(stream, buf).await?;
            };
            let size = usize::from_str_radix(
                std::str::from_utf8(&buf[..line])
                    .ok()?
                    .split(';')
                    .next()?
                    .trim(),
                16,
            )
            .ok()?;
            buf.drain(..line + 2);
            while buf.len() < size + 2 {
                fill(stream, buf).await?;
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
    } else if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        while buf.len() < len {
            fill(stream, buf).await?;
        }
        body = buf.drain(..len).collect();
    }
    Some((head, body))
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One response as the client read it: the status line, the fields (lowercase, sorted, the
/// `date` left out: its value is the clock's), and the body, decoded.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    status: String,
    fields: Vec<String>,
    body: Vec<u8>,
    dated: bool,
}

/// Reads the client's side after `request`: `answers` responses, or up to the close. Also
/// whether the connection closed. With `cut`, the client closes its side after the request
/// (cutting what it did not send) and reads until the gateway closes.
async fn exchange(
    port: u16,
    request: &[u8],
    answers: usize,
    head: bool,
    cut: bool,
) -> (Vec<Read>, bool) {
    exchange_in_pieces(port, request, (&[], 0), answers, head, cut).await
}

/// [`exchange`], the request written in pieces: a pause of `pieces.1` ms before each offset
/// of `pieces.0`.
async fn exchange_in_pieces(
    port: u16,
    request: &[u8],
    pieces: (&[usize], u64),
    answers: usize,
    head: bool,
    cut: bool,
) -> (Vec<Read>, bool) {
    let (pieces, pause) = pieces;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut from = 0;
    for &at in pieces.iter() {
        stream.write_all(&request[from..at]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(pause)).await;
        from = at;
    }
    stream.write_all(&request[from..]).await.unwrap();
    if cut {
        stream.shutdown().await.unwrap();
    }
    let mut raw = Vec::new();
    let mut closed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let reads = loop {
        let reads = parse_responses(&raw, head, closed);
        if closed || (!cut && reads.len() >= answers) {
            break reads;
        }
        let mut chunk = [0u8; 64 * 1024];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed = true,
            Ok(Ok(n)) => raw.extend_from_slice(&chunk[..n]),
            Err(_) => panic!(
                "no complete answer within 10 s: {:?}",
                String::from_utf8_lossy(&raw)
            ),
        }
    };
    if !closed {
        // A close that follows the last answer at once.
        let mut byte = [0u8; 1];
        closed = matches!(
            tokio::time::timeout(Duration::from_millis(150), stream.read(&mut byte)).await,
            Ok(Ok(0)) | Ok(Err(_))
        );
    }
    (reads, closed)
}

/// The complete responses at the start of `raw`.
fn parse_responses(raw: &[u8], head: bool, closed: bool) -> Vec<Read> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(end) = find(&raw[at..], b"\r\n\r\n") {
        let text = String::from_utf8_lossy(&raw[at..at + end]).into_owned();
        let mut lines = text.split("\r\n");
        let status = lines.next().unwrap_or("").to_owned();
        let code: u16 = status
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut fields: Vec<String> = lines
            .map(|l| {
                let (name, value) = l.split_once(':').unwrap_or((l, ""));
                format!("{}: {}", name.to_ascii_lowercase(), value.trim())
            })
            .collect();
        let dated = fields.iter().any(|f| f.starts_with("date: "));
        fields.retain(|f| !f.starts_with("date: "));
        fields.sort();
        let mut pos = at + end + 4;
        let field = |name: &str| {
            fields
                .iter()
                .find_map(|f| f.strip_prefix(name))
                .map(str::to_owned)
        };
        let body = if head || code < 200 || code == 204 || code == 304 {
            Vec::new()
        } else if field("transfer-encoding: ").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let Some(line) = find(&raw[pos..], b"\r\n") else {
                    return out;
                };
                let size_text = String::from_utf8_lossy(&raw[pos..pos + line]).into_owned();
                let Ok(size) =
                    usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                else {
                    return out;
                };
                pos += line + 2;
                if size == 0 {
                    // No trailers (the blank line at once), or trailers up to a blank line.
                    if raw[pos..].starts_with(b"\r\n") {
                        pos += 2;
                    } else if let Some(end) = find(&raw[pos..], b"\r\n\r\n") {
                        pos += end + 4;
                    } else {
                        return out;
                    }
                    break body;
                }
                if raw.len() < pos + size + 2 {
                    return out;
                }
                body.extend_from_slice(&raw[pos..pos + size]);
                pos += size + 2;
            }
        } else if let Some(len) = field("content-length: ").and_then(|v| v.parse::<usize>().ok()) {
            if raw.len() < pos + len {
                return out;
            }
            pos += len;
            raw[pos - len..pos].to_vec()
        } else if closed {
            let body = raw[pos..].to_vec();
            pos = raw.len();
            body
        } else {
            return out;
        };
        out.push(Read {
            status,
            fields,
            body,
            dated,
        });
        at = pos;
    }
    out
}

/// What differs between the two gateways by their clocks and not by their paths reads the
/// same: made-up request ids (`<made>`), and the seconds and milliseconds until a bucket
/// refills (`RateLimit`'s `t`, `Retry-After`, `retry_after_ms`).
fn mask(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(": ") {
            Some((name, value))
                if name.eq_ignore_ascii_case("x-request-id")
                    && !["client-id-1", "up-id"].contains(&value) =>
            {
                format!("{name}: <made>")
            }
            Some((name, _)) if name.eq_ignore_ascii_case("retry-after") => {
                format!("{name}: <s>")
            }
            _ => mask_numbers(l, &[";t=", "\"retry_after_ms\":"]),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with the digits after each of `after` replaced by `N`.
fn mask_numbers(text: &str, after: &[&str]) -> String {
    let mut out = text.to_owned();
    for marker in after {
        let mut from = 0;
        while let Some(at) = out[from..].find(marker) {
            let start = from + at + marker.len();
            let digits = out[start..]
                .chars()
                .take_while(char::is_ascii_digit)
                .count();
            out.replace_range(start..start + digits, "N");
            from = start + 1;
        }
    }
    out
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    /// Answers the client gets.
    answers: usize,
    /// Requests the byte path serves itself.
    bytes: u32,
    /// Whether the request is a `HEAD` (its answers have no body).
    head: bool,
    /// Whether the client closes its side after sending the request.
    cut: bool,
    /// Offsets in `request` where the client pauses (a few milliseconds) before writing on:
    /// the request arrives in pieces.
    pieces: &'static [usize],
    /// Whether those pauses are long (150 ms: past the byte path's wait for a chunked body).
    slow: bool,
    /// Whether what the upstream receives may differ: the byte path sends an idempotent
    /// request again when a pooled connection closes before any answer, as nginx does;
    /// hyper's client does not.
    resent: bool,
    /// The statuses both paths must answer with, in order (empty: only compared).
    statuses: &'static [u16],
    /// Lines every request head the upstream receives must have, on both paths (names in
    /// lowercase).
    upstream_has: &'static [&'static str],
}

impl Case {
    /// The pause between pieces, in ms: long enough for a piece to be read on its own, and
    /// well within the 100 ms the byte path waits for the rest of a chunked body unless
    /// `slow`.
    fn pause(&self) -> u64 {
        if self.slow {
            150
        } else {
            5
        }
    }
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: example.test\r\nUser-Agent: diff/1\r\n{extra}\r\n")
        .into_bytes()
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: example.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body].concat()
}

fn case(name: &'static str, request: Vec<u8>, answers: usize, bytes: u32) -> Case {
    Case {
        name,
        request,
        answers,
        bytes,
        head: false,
        cut: false,
        pieces: &[],
        slow: false,
        resent: false,
        statuses: &[],
        upstream_has: &[],
    }
}

fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    // The upstream's framings and fields, through an ordinary GET.
    for name in [
        "plain",
        "chunked",
        "close",
        "nocontent",
        "notmodified",
        "continue",
        "hop",
        "reason",
        "unknown",
        "ratelimit",
        "garbage",
        "dupcl",
        "badcl",
        "clte",
        "badchunk",
        "big",
        "bigchunked",
        "cut",
    ] {
        let path = format!("/api/r/{name}");
        // A broken chunk, or a body cut short, fails the answer before the client can read it
        // whole.
        let answers = usize::from(name != "badchunk" && name != "cut");
        cases.push(case(name, get(&path, ""), answers, 1));
    }
    cases.push(Case {
        resent: true,
        ..case("drop", get("/api/r/drop", ""), 1, 1)
    });
    cases.push(Case {
        head: true,
        ..case(
            "HEAD",
            b"HEAD /api/r/x HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec(),
            1,
            1,
        )
    });
    cases.push(Case {
        head: true,
        ..case(
            "HEAD denied",
            b"HEAD /limited/h HTTP/1.1\r\nHost: example.test\r\n\r\nHEAD /limited/h HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec(),
            2,
            2,
        )
    });
    // What the client sends.
    cases.push(case(
        "connection close",
        get("/api/r/x", "Connection: close\r\n"),
        1,
        1,
    ));
    cases.push(case(
        "hop-by-hop fields",
        get(
            "/api/r/x",
            "Connection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: 5\r\nTE: trailers\r\nTrailer: x\r\nProxy-Authorization: basic\r\nProxy-Connection: keep-alive\r\nX-Kept: k\r\n",
        ),
        1,
        1,
    ));
    cases.push(case(
        "x-forwarded-for lines",
        get(
            "/api/r/x",
            "X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-For: , 10.0.0.2 \r\n",
        ),
        1,
        1,
    ));
    cases.push(case(
        "forwarded",
        get("/api/r/x", "Forwarded: for=1.2.3.4\r\n"),
        1,
        1,
    ));
    cases.push(case(
        "request id kept",
        get("/api/r/x", "X-Request-Id: client-id-1\r\n"),
        1,
        1,
    ));
    cases.push(case(
        "request id replaced",
        get("/api/r/x", "X-Request-Id: has space\r\n"),
        1,
        1,
    ));
    cases.push(case(
        "no host",
        b"GET /api/r/x HTTP/1.1\r\nAccept: */*\r\n\r\n".to_vec(),
        1,
        1,
    ));
    cases.push(case(
        "repeated and mixed-case fields",
        get(
            "/api/r/x",
            "x-many: 1\r\nX-Many: 2\r\nACCEPT: a\r\naccept: b\r\n",
        ),
        1,
        1,
    ));
    cases.push(case(
        "obs-text value",
        get("/api/r/x", "X-Name: caf\u{e9}\r\n"),
        1,
        1,
    ));
    cases.push(case("query", get("/api/r/x?a=1&b=%20&c", ""), 1, 1));
    cases.push(case("dot segments", get("/free/../api/r/x", ""), 1, 1));
    cases.push(case("ambiguous path", get("/api/a%2fb", ""), 1, 1));
    cases.push(case("no route", get("/nowhere", ""), 1, 1));
    cases.push(case(
        "method not allowed",
        b"DELETE /only-get/x HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec(),
        1,
        1,
    ));
    cases.push(case(
        "denied",
        [get("/limited/a", ""), get("/limited/a", "")].concat(),
        2,
        2,
    ));
    cases.push(case(
        "content-length 0",
        get("/api/r/x", "Content-Length: 0\r\n"),
        1,
        1,
    ));
    cases.push(case(
        "pipelined",
        [
            get("/api/r/x", ""),
            get("/api/r/chunked", ""),
            get("/api/r/y", ""),
        ]
        .concat(),
        3,
        3,
    ));
    cases.push(case(
        "pipelined, then a body",
        [
            get("/api/r/x", ""),
            post("/api/r/p", b"abc"),
            get("/api/r/z", ""),
        ]
        .concat(),
        3,
        3,
    ));
    // Request bodies with a length: read whole on the byte path, up to 64 KiB.
    cases.push(case("body", post("/api/r/p", b"hello"), 1, 1));
    cases.push(case(
        "a 1 KiB JSON body",
        post(
            "/api/r/p",
            format!("{{\"input\":\"{}\"}}", "j".repeat(1010)).as_bytes(),
        ),
        1,
        1,
    ));
    cases.push(case(
        "a 64 KiB body",
        post("/api/r/p", &vec![b'b'; 64 * 1024]),
        1,
        1,
    ));
    // Longer: the first 64 KiB read before the upstream is taken, the rest streamed.
    cases.push(case(
        "a body over 64 KiB",
        post("/api/r/p", &vec![b'b'; 64 * 1024 + 1]),
        1,
        1,
    ));
    cases.push(case(
        "a 1 MiB body, then a GET",
        [post("/api/r/p", &vec![b'm'; 1 << 20]), get("/api/r/z", "")].concat(),
        2,
        2,
    ));
    let long = post("/api/r/p", &vec![b'l'; 200_000]);
    let at = long.len() - 200_000;
    cases.push(Case {
        pieces: &[150, 40_000, 90_000, 150_000],
        ..case("a 200 KB body in pieces", long.clone(), 1, 1)
    });
    cases.push(Case {
        cut: true,
        ..case(
            "a 200 KB body cut after 100 KB",
            long[..at + 100_000].to_vec(),
            1,
            1,
        )
    });
    cases.push(case(
        "two bodies, then a GET",
        [
            post("/api/r/p", b"first"),
            post("/api/r/p", b"second body"),
            get("/api/r/z", ""),
        ]
        .concat(),
        3,
        3,
    ));
    // Denied with the body sent along: skipped, the connection kept for the next request.
    cases.push(Case {
        statuses: &[429, 429, 429],
        ..case(
            "bodies denied",
            [
                post("/limited/b", b"one"),
                post("/limited/b", b"two"),
                post("/limited/b", b"three"),
            ]
            .concat(),
            3,
            3,
        )
    });
    // Over the route's max_body: 413 before the body is read, and the connection closes.
    cases.push(Case {
        statuses: &[413],
        ..case(
            "a body over max_body",
            [post("/small/p", b"0123456789abcdef!"), get("/small/x", "")].concat(),
            1,
            1,
        )
    });
    cases.push(Case {
        statuses: &[200, 413],
        ..case(
            "max_body, then over it",
            [
                post("/small/p", b"0123456789abcdef"),
                post("/small/p", b"0123456789abcdef!"),
            ]
            .concat(),
            2,
            2,
        )
    });
    // Settled costs: the answer relayed as it comes, read by the meter on the way.
    cases.push(case(
        "settled, an event stream",
        get("/settled/r/sse", ""),
        1,
        1,
    ));
    cases.push(case(
        "settled, an event stream, then a GET",
        [get("/settled/r/sse", ""), get("/api/r/x", "")].concat(),
        2,
        2,
    ));
    cases.push(case("settled, JSON", get("/settled/r/plain", ""), 1, 1));
    cases.push(case(
        "settled by a trailer",
        get("/trailered/r/costtrailer", ""),
        1,
        1,
    ));
    // A body cut short by the client's close (its write side): an error answer, nothing
    // upstream, the connection closed.
    cases.push(Case {
        cut: true,
        ..case(
            "a body cut mid-way",
            b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nContent-Length: 10\r\n\r\nhello"
                .to_vec(),
            1,
            1,
        )
    });
    // Chunked request bodies that come whole with their head: forwarded with a length, as
    // hyper's path forwards a body it read whole; extensions and trailers dropped.
    cases.push(case(
        "chunked request",
        b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_vec(),
        1,
        1,
    ));
    cases.push(case(
        "chunked request, extensions and trailers, then a GET",
        [
            b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Sum: 7\r\n\r\n".to_vec(),
            get("/api/r/z", ""),
        ]
        .concat(),
        2,
        2,
    ));
    cases.push(case(
        "chunked request, empty",
        b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
        1,
        1,
    ));
    cases.push(Case {
        statuses: &[429, 429],
        ..case(
            "chunked requests denied",
            [
                b"POST /limited/c HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n".to_vec(),
                b"POST /limited/c HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nho\r\n0\r\n\r\n".to_vec(),
            ]
            .concat(),
            2,
            2,
        )
    });
    cases.push(Case {
        statuses: &[413],
        ..case(
            "chunked request over max_body",
            b"POST /small/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n0123456789abcdef!\r\n0\r\n\r\n".to_vec(),
            1,
            1,
        )
    });
    // Chunked bodies written in pieces, as a client encoding as it goes sends them: the
    // byte path waits for the rest (within 100 ms) and forwards it with a length.
    const IN_PIECES: &[u8] = b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
    cases.push(Case {
        pieces: &[74, 82, 85],
        ..case("chunked request in pieces", IN_PIECES.to_vec(), 1, 1)
    });
    cases.push(Case {
        pieces: &[74, 91],
        ..case(
            "chunked request in pieces, then a GET",
            [IN_PIECES.to_vec(), get("/api/r/z", "")].concat(),
            2,
            2,
        )
    });
    // Cut after its first chunk: left to hyper, which answers a body cut short.
    cases.push(Case {
        pieces: &[74],
        cut: true,
        ..case(
            "chunked request in pieces, cut",
            IN_PIECES[..82].to_vec(),
            1,
            0,
        )
    });
    // Growing past 64 KiB of chunks in pieces: streamed upstream chunked, as hyper's client
    // streams it (extensions and trailers dropped).
    let piece = format!("{:x};e=1\r\n{}\r\n", 20_000, "p".repeat(20_000));
    let long_chunked = format!(
        "POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\nX-Sum: 1\r\n\r\n",
        piece.repeat(4)
    )
    .into_bytes();
    cases.push(Case {
        pieces: &[74, 74 + 20_012, 74 + 2 * 20_012, 74 + 3 * 20_012],
        ..case(
            "chunked request in pieces, over 64 KiB",
            long_chunked.clone(),
            1,
            1,
        )
    });
    cases.push(case(
        "chunked request over 64 KiB, then a GET",
        [long_chunked.clone(), get("/api/r/z", "")].concat(),
        2,
        2,
    ));
    // Slower than the byte path waits for: read on once admitted, whole within 64 KiB.
    cases.push(Case {
        pieces: &[74, 82],
        slow: true,
        ..case("chunked request, slow pieces", IN_PIECES.to_vec(), 1, 1)
    });
    cases.push(Case {
        pieces: &[74, 74 + 20_012, 74 + 2 * 20_012],
        slow: true,
        ..case(
            "chunked request over 64 KiB, slow pieces",
            long_chunked.clone(),
            1,
            1,
        )
    });
    cases.push(Case {
        pieces: &[74, 74 + 20_012],
        cut: true,
        slow: true,
        ..case(
            "chunked request over 64 KiB, cut",
            long_chunked[..74 + 3 * 20_012].to_vec(),
            1,
            1,
        )
    });
    cases.push(Case {
        statuses: &[413],
        ..case(
            "chunked request over 64 KiB, over max_body",
            [b"POST /small/p".to_vec(), long_chunked[13..].to_vec()].concat(),
            1,
            1,
        )
    });
    // Left to hyper: broken chunks, and the smuggling shapes (a length
    // beside the coding, two coding fields, another coding).
    let big = "b".repeat(64 * 1024 + 1);
    cases.push(case(
        "chunked request over 64 KiB",
        format!("POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n", big.len()).into_bytes(),
        1,
        1,
    ));
    cases.push(case(
        "chunked request, broken chunks",
        b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
        1,
        0,
    ));
    for (name, fields) in [
        (
            "length and coding",
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
        ),
        (
            "two codings",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        ),
        ("gzip, chunked", "Transfer-Encoding: gzip, chunked\r\n"),
    ] {
        cases.push(case(
            name,
            format!(
                "POST /api/r/p HTTP/1.1\r\nHost: example.test\r\n{fields}\r\n3\r\nabc\r\n0\r\n\r\n"
            )
            .into_bytes(),
            1,
            0,
        ));
    }
    cases.push(case(
        "HTTP/1.0",
        b"GET /api/r/x HTTP/1.0\r\nHost: example.test\r\n\r\n".to_vec(),
        1,
        0,
    ));
    cases.push(case(
        "absolute form",
        b"GET http://example.test/api/r/x HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec(),
        1,
        0,
    ));
    cases.push(case(
        "asterisk",
        b"OPTIONS * HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec(),
        1,
        0,
    ));
    cases.push(case(
        "upgrade",
        get("/api/r/x", "Upgrade: websocket\r\nConnection: upgrade\r\n"),
        1,
        0,
    ));
    cases.push(case(
        "expect",
        b"POST /api/r/p HTTP/1.1\r\nHost: example.test\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        2,
        0,
    ));
    // hyper (and so `wire`) reads a head with bare LF line ends.
    cases.push(case(
        "bare LF",
        b"GET /api/r/x HTTP/1.1\nHost: example.test\n\n".to_vec(),
        1,
        1,
    ));
    cases.push(case(
        "obs-fold",
        get("/api/r/x", "X-Folded: a\r\n b\r\n"),
        1,
        0,
    ));
    cases.push(case(
        "head over max_header_bytes",
        get("/api/r/x", &format!("X-Big: {}\r\n", "h".repeat(17_000))),
        1,
        0,
    ));
    // The same bound on a connection's later heads as on its first.
    for (name, size) in [
        ("second head over max_header_bytes (17 KB)", 17_000),
        ("second head over max_header_bytes (20 KB)", 20_000),
    ] {
        let big = get("/api/r/y", &format!("X-Big: {}\r\n", "h".repeat(size)));
        cases.push(Case {
            statuses: &[200, 431],
            ..case(name, [get("/api/r/x", ""), big].concat(), 2, 1)
        });
    }
    cases.push(case(
        "grpc-web",
        get("/api/r/x", "Content-Type: application/grpc-web\r\n"),
        1,
        0,
    ));
    // The HTTP/2 preface is allowed only at a connection's start (RFC 9113 §3.4): after a
    // request it is no switch to HTTP/2 but an HTTP/1.1 request hyper refuses. Whole, hyper
    // closes the connection without an answer (it finds the preface in its buffer); its first
    // line alone, a request of version 2.0, gets 400.
    // Host (RFC 9112 §3.2, §3.2.2): two are refused; an absolute-form target's host replaces
    // the client's `Host`.
    cases.push(Case {
        statuses: &[400],
        ..case("two hosts", get("/api/r/x", "Host: other.test\r\n"), 1, 1)
    });
    cases.push(Case {
        statuses: &[400],
        ..case(
            "two hosts, the same",
            get("/api/r/x", "Host: example.test\r\n"),
            1,
            1,
        )
    });
    cases.push(Case {
        upstream_has: &["\r\nhost: example.test:8080\r\n"],
        ..case(
            "absolute form, another host",
            b"GET http://example.test:8080/api/r/x HTTP/1.1\r\nHost: other.test\r\n\r\n".to_vec(),
            1,
            0,
        )
    });
    // Lengths hyper reads as one (it keeps the first): forwarded once.
    cases.push(case(
        "content-length 0 and 00",
        get("/api/r/x", "Content-Length: 0\r\nContent-Length: 00\r\n"),
        1,
        1,
    ));
    // An answer's keep-alive as hyper's client reads it: a `close` stands.
    cases.push(case(
        "HTTP/1.0 answer, close then keep-alive",
        [get("/api/r/close10", ""), get("/api/r/y", "")].concat(),
        2,
        2,
    ));
    cases.push(Case {
        statuses: &[200],
        ..case(
            "HTTP/2 preface after a request",
            [get("/api/r/x", ""), PREFACE.to_vec()].concat(),
            1,
            1,
        )
    });
    cases.push(Case {
        statuses: &[200, 400],
        ..case(
            "the preface's request line after a request",
            [get("/api/r/x", ""), PREFACE[..18].to_vec()].concat(),
            2,
            1,
        )
    });
    cases
}

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn config(up: u16) -> String {
    format!(
        r#"
[[policy]]
name = "open"
capacity = 100000
rate = "1/h"
key = "ip"

[[policy]]
name = "shut"
capacity = 1
rate = "1/h"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["open"]
upstream = "http://127.0.0.1:{up}"

[[route]]
path_prefix = "/limited/"
policies = ["shut"]
upstream = "http://127.0.0.1:{up}"

[[policy]]
name = "metered"
capacity = 1000
rate = "1/h"
key = "ip"
cost = {{ reserve = 10, settle = "openai" }}

[[policy]]
name = "trailered"
capacity = 1000
rate = "1/h"
key = "ip"
cost = {{ reserve = 10, settle = "trailer:x-cost" }}

[[route]]
path_prefix = "/settled/"
policies = ["metered"]
upstream = "http://127.0.0.1:{up}"

[[route]]
path_prefix = "/trailered/"
policies = ["trailered"]
upstream = "http://127.0.0.1:{up}"

[[route]]
path_prefix = "/small/"
max_body = "16"
upstream = "http://127.0.0.1:{up}"

[[route]]
path_prefix = "/only-get/"
methods = ["GET"]
upstream = "http://127.0.0.1:{up}"

[[route]]
path_prefix = "/free/"
upstream = "http://127.0.0.1:{up}"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_path_forwards_and_answers_what_hyper_does() {
    let seen: Seen = Arc::default();
    let up = upstream(Arc::clone(&seen)).await;
    let bytes = Gateway::start("workers = 1\nbyte_path = true", &config(up)).await;
    let hyper = Gateway::start("workers = 1\nbyte_path = false", &config(up)).await;
    let mut differ = Vec::new();
    println!("| case | served as bytes | answers | same upstream view | same client view |");
    println!("|---|---|---|---|---|");
    for case in corpus() {
        let before = metric(&bytes, "sluice_byte_path_requests_total").await;
        seen.lock().unwrap().clear();
        let (answers_b, closed_b) = exchange_in_pieces(
            bytes.port,
            &case.request,
            (case.pieces, case.pause()),
            case.answers,
            case.head,
            case.cut,
        )
        .await;
        let upstream_b = std::mem::take(&mut *seen.lock().unwrap());
        let served = metric(&bytes, "sluice_byte_path_requests_total").await - before;
        let (answers_h, closed_h) = exchange_in_pieces(
            hyper.port,
            &case.request,
            (case.pieces, case.pause()),
            case.answers,
            case.head,
            case.cut,
        )
        .await;
        let upstream_h = std::mem::take(&mut *seen.lock().unwrap());
        let view = |seen: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
            seen.iter()
                .map(|(head, body)| (mask(head), body.clone()))
                .collect()
        };
        let masked = |reads: &[Read]| -> Vec<Read> {
            reads
                .iter()
                .map(|r| Read {
                    status: r.status.clone(),
                    fields: r.fields.iter().map(|f| mask(f)).collect(),
                    body: mask(&String::from_utf8_lossy(&r.body)).into_bytes(),
                    dated: r.dated,
                })
                .collect()
        };
        let same_upstream = case.resent || view(&upstream_b) == view(&upstream_h);
        let same_client = masked(&answers_b) == masked(&answers_h) && closed_b == closed_h;
        println!(
            "| {} | {served} | {} | {} | {} |",
            case.name,
            answers_b.len(),
            if case.resent {
                "not compared (resent)"
            } else if same_upstream {
                "yes"
            } else {
                "NO"
            },
            if same_client { "yes" } else { "NO" },
        );
        if !same_upstream {
            differ.push(format!(
                "{}: the upstream received\n  byte path: {:?}\n  hyper:     {:?}",
                case.name,
                view(&upstream_b),
                view(&upstream_h)
            ));
        }
        if !same_client {
            differ.push(format!(
                "{}: the client received\n  byte path (closed {closed_b}): {:?}\n  hyper     (closed {closed_h}): {:?}",
                case.name, answers_b, answers_h
            ));
        }
        let statuses = |reads: &[Read]| -> Vec<u16> {
            reads
                .iter()
                .filter_map(|r| r.status.split(' ').nth(1)?.parse().ok())
                .collect()
        };
        if !case.statuses.is_empty() {
            for (path, answers) in [("byte path", &answers_b), ("hyper", &answers_h)] {
                if statuses(answers) != case.statuses {
                    differ.push(format!(
                        "{}: the {path} answered {:?}, not {:?}: {answers:?}",
                        case.name,
                        statuses(answers),
                        case.statuses
                    ));
                }
            }
        }
        for (path, seen) in [("byte path", &upstream_b), ("hyper", &upstream_h)] {
            for (head, _) in seen.iter() {
                let head = head.to_ascii_lowercase();
                if let Some(missing) = case.upstream_has.iter().find(|l| !head.contains(*l)) {
                    differ.push(format!(
                        "{}: the upstream received no {missing:?} from the {path}: {head:?}",
                        case.name
                    ));
                }
            }
        }
        if served != f64::from(case.bytes) {
            differ.push(format!(
                "{}: the byte path served {served} requests, not {}",
                case.name, case.bytes
            ));
        }
        for (path, answers) in [("byte path", &answers_b), ("hyper", &answers_h)] {
            if answers.len() != case.answers {
                differ.push(format!(
                    "{}: {} answers on the {path}, not {}: {answers:?}",
                    case.name,
                    answers.len(),
                    case.answers
                ));
            }
        }
        // Interim answers (`100 Continue`) carry no date.
        let interim = |r: &Read| {
            r.status
                .split(' ')
                .nth(1)
                .is_some_and(|c| c.starts_with('1'))
        };
        if answers_b.iter().any(|r| !r.dated && !interim(r)) {
            differ.push(format!("{}: an answer without a date", case.name));
        }
    }
    // The settled cases charged the same on both: the two streams' 42 tokens each and the
    // JSON answer's estimate of 10 (it reports no usage); the trailer's 7.
    for (gw, path) in [(&bytes, "byte path"), (&hyper, "hyper")] {
        for (policy, want) in [("metered", 1000 - 42 - 42 - 10), ("trailered", 1000 - 7)] {
            let body = format!(r#"{{"policy":"{policy}","key":"127.0.0.1","cost":0}}"#);
            let mut left = 0;
            for _ in 0..100 {
                let answer = common::post(&gw.admin("/v1/check"), &body).await;
                left = answer.json()["remaining"].as_u64().unwrap();
                if left == want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(left, want, "{policy} on the {path}");
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    for gw in [&bytes, &hyper] {
        assert!(!gw.log_text().contains("panicked"), "{}", gw.log_text());
    }
}

/// Polls `series` on the gateway's metrics until it reads `want`, for at most 3 s.
async fn metric_reaches(gw: &Gateway, series: &str, want: f64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        if metric(gw, series).await == want {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that closes its connection while its request waits in a queue leaves the queue at
/// once, and its place goes to the next request, on either path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_queued_leaves_the_queue() {
    let up = upstream(Arc::default()).await;
    let config = format!(
        r#"
[[policy]]
name = "q"
capacity = 1
rate = "1/h"
key = "global"
queue = {{ depth = 1, max_wait = "2h" }}

[[route]]
path_prefix = "/q/"
policies = ["q"]
upstream = "http://127.0.0.1:{up}"
"#
    );
    for byte_path in [true, false] {
        let gw = Gateway::start(&format!("workers = 1\nbyte_path = {byte_path}"), &config).await;
        let (answers, _) = exchange(gw.port, &get("/q/first", ""), 1, false, false).await;
        assert!(answers[0].status.contains(" 200 "), "{answers:?}");
        // The next one waits for the token an hour away.
        let mut waiting = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        waiting.write_all(&get("/q/second", "")).await.unwrap();
        assert!(
            metric_reaches(&gw, "sluice_policy_waiting", 1.0).await,
            "byte_path = {byte_path}: the request never queued"
        );
        drop(waiting);
        assert!(
            metric_reaches(&gw, "sluice_policy_waiting", 0.0).await,
            "byte_path = {byte_path}: a request whose client has gone still waits"
        );
        // Its place is free: the next request waits rather than finding the queue full.
        let mut next = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        next.write_all(&get("/q/third", "")).await.unwrap();
        assert!(
            metric_reaches(&gw, "sluice_policy_waiting", 1.0).await,
            "byte_path = {byte_path}: the queue stayed full"
        );
    }
}

/// The bytes queued on a TCP connection of this network namespace, from `/proc/net/tcp`: the
/// receive queue of the socket `local` → `remote` (read by no one yet) and its send queue
/// (written, not yet taken by the peer).
fn tcp_queues(local: u16, remote: u16) -> Option<(usize, usize)> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if port(fields.get(1)?)? != local || port(fields.get(2)?)? != remote {
            return None;
        }
        let (tx, rx) = fields.get(4)?.split_once(':')?;
        Some((
            usize::from_str_radix(rx, 16).ok()?,
            usize::from_str_radix(tx, 16).ok()?,
        ))
    })
}

/// While a request waits for a slow upstream, the gateway reads a client's pipelined bytes no
/// further than `max_header_bytes` (hyper's bound on its read buffer): the rest stays in the
/// kernel's socket buffers, and the client is pushed back. What the gateway took is what the
/// client wrote minus what is still queued on either side of the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_bytes_are_read_no_further_than_max_header_bytes_while_a_request_waits() {
    let up = common::Upstream::start().await;
    let config = common::config::route("/slow/", &[], &up.url());
    let max_header_bytes = 16 * 1024;
    let mut report = Vec::new();
    for byte_path in [true, false] {
        let gw = Gateway::start(&format!("workers = 1\nbyte_path = {byte_path}"), &config).await;
        let mut client = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        let client_port = client.local_addr().unwrap().port();
        client.write_all(&get("/slow/3000", "")).await.unwrap();
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (mut reader, mut writer) = client.into_split();
        let writing = {
            let written = Arc::clone(&written);
            tokio::spawn(async move {
                // 600 KB of pipelined requests, more than any read-ahead allowed so far.
                let next = get("/slow/0", &format!("X-Pad: {}\r\n", "p".repeat(900)));
                for _ in 0..600_000 / next.len() {
                    if writer.write_all(&next).await.is_err() {
                        return writer;
                    }
                    written.fetch_add(next.len(), std::sync::atomic::Ordering::SeqCst);
                }
                writer
            })
        };
        // The first request is still at the upstream, and the writer has filled what it can.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (gateway_unread, _) = tcp_queues(gw.port, client_port).expect("the gateway's side");
        let (_, client_unsent) = tcp_queues(client_port, gw.port).expect("the client's side");
        let sent = written.load(std::sync::atomic::Ordering::SeqCst);
        let taken = sent.saturating_sub(gateway_unread + client_unsent);
        report.push(format!(
            "byte_path = {byte_path}: the client wrote {sent} bytes after the first request, \
             the gateway read {taken} of them"
        ));
        writing.abort();
        drop(reader.read(&mut [0u8; 1]).await);
        // One more read's worth (8 KiB) may land before the bound is looked at.
        assert!(
            taken <= max_header_bytes + 8 * 1024,
            "{}",
            report.join("\n")
        );
    }
    println!("{}", report.join("\n"));
}

/// The `sluice::access` lines of a gateway's log for `path`, and each line's `ms`.
fn access_lines(gw: &Gateway, path: &str) -> Vec<(String, f64)> {
    gw.log_text()
        .lines()
        .filter(|l| l.contains("sluice::access") && l.contains(&format!("path={path} ")))
        .map(|l| {
            let ms = l
                .split_whitespace()
                .find_map(|f| f.strip_prefix("ms="))
                .and_then(|v| v.trim_matches('"').parse().ok())
                .unwrap_or(f64::NAN);
            (l.to_owned(), ms)
        })
        .collect()
}

/// Every request that reached a decision has its access log line on both paths, one whose
/// answer failed mid-body (the upstream cut it short) too; and `ms` means the same on both:
/// the time until the answer's head, not the body's transfer (an upstream that sends its body
/// a second after its head does not make it a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_every_request_with_the_same_ms_on_both_paths() {
    let up = upstream(Arc::default()).await;
    let mut lines = Vec::new();
    for byte_path in [true, false] {
        let gw = Gateway::start(
            &format!("workers = 1\nbyte_path = {byte_path}"),
            &config(up),
        )
        .await;
        let (answers, closed) = exchange(gw.port, &get("/api/r/cut", ""), 1, false, false).await;
        assert!(answers.is_empty() && closed, "{answers:?}");
        let (answers, _) = exchange(gw.port, &get("/api/r/slowbody", ""), 1, false, false).await;
        assert_eq!(answers.len(), 1);
        // The line may follow the answer by a moment.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while access_lines(&gw, "/api/r/slowbody").is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cut = access_lines(&gw, "/api/r/cut");
        let slow = access_lines(&gw, "/api/r/slowbody");
        lines.push(format!("byte_path = {byte_path}:\n  {cut:?}\n  {slow:?}"));
        assert!(
            cut.len() == 1 && cut[0].0.contains("status=200"),
            "byte_path = {byte_path}: the lines of a request whose answer was cut short: {cut:?}"
        );
        assert!(
            slow.len() == 1 && slow[0].1 < 500.0,
            "byte_path = {byte_path}: `ms` of an answer whose body came a second after its head: {slow:?}"
        );
    }
    println!("{}", lines.join("\n"));
}
