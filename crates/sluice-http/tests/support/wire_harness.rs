//! The differential between `sluice_http::wire` and hyper 1.x, shared by the
//! `wire_differential` tests and the `wire` fuzz target (which includes this file by path).
//!
//! Requests: the bytes go to hyper's HTTP/1.1 server over an in-memory duplex, with a service
//! that records what it reads and answers `200`; [`check_request`] then walks the same bytes
//! with `wire::Request::parse` and holds every `Plain` head to what hyper read. Responses: the
//! bytes come from a fake upstream to hyper's HTTP/1.1 client; [`check_response`] walks them
//! with `wire::Response::parse` and `wire::Chunks` and holds every `Final` head to hyper.
//!
//! The runtime is a current-thread one with a paused clock: a timeout elapses only once every
//! task waits, so "hyper has done all it will do with these bytes" is decided without sleeping.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use sluice_http::wire::{self, Chunks, Framing, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

/// The head limit on both sides: hyper's `max_buf_size` and `max_header_size` (as the
/// gateway sets them) and wire's `max_head`.
pub const MAX_HEAD: usize = 8192;

/// How long (on the paused clock) a side may stay quiet before it is taken as done.
const IDLE: Duration = Duration::from_secs(5);

/// A runtime for the differentials: current-thread, its clock paused.
pub fn paused_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// A request as hyper's server handed it to the service.
#[derive(Debug, Clone)]
pub struct Served {
    /// The method.
    pub method: String,
    /// The target, as the `Uri` displays it.
    pub uri: String,
    /// Whether it was HTTP/1.0.
    pub http10: bool,
    /// The fields, lowercase names, in the `HeaderMap`'s order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body once read to its end (`Err` if hyper failed it), `None` while unread.
    pub body: Option<Result<Vec<u8>, String>>,
}

/// What hyper's server did with a connection's bytes.
#[derive(Debug, Clone)]
pub struct ServerRun {
    /// The requests the service saw, in order.
    pub served: Vec<Served>,
    /// The responses hyper wrote: status and whether the connection stays open after it.
    pub answers: Vec<(u16, bool)>,
    /// Whether hyper closed the connection.
    pub closed: bool,
}

impl ServerRun {
    /// A short account for the corpus table.
    pub fn verdict(&self) -> String {
        let statuses: Vec<String> = self.answers.iter().map(|(s, _)| s.to_string()).collect();
        format!(
            "served {} [{}]{}",
            self.served.len(),
            statuses.join(","),
            if self.closed { " closed" } else { "" }
        )
    }
}

/// Feeds `input` to hyper's HTTP/1.1 server and records what it did.
pub async fn serve(input: &[u8]) -> ServerRun {
    let (mut client, server) = tokio::io::duplex(input.len().max(1 << 16) * 2);
    let served: Arc<Mutex<Vec<Served>>> = Arc::default();
    let seen = Arc::clone(&served);
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let index = {
                let mut seen = seen.lock().expect("not poisoned");
                seen.push(Served {
                    method: req.method().as_str().to_owned(),
                    uri: req.uri().to_string(),
                    http10: req.version() == http::Version::HTTP_10,
                    headers: req
                        .headers()
                        .iter()
                        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                        .collect(),
                    body: None,
                });
                seen.len() - 1
            };
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .map_err(|e| e.to_string());
            seen.lock().expect("not poisoned")[index].body = Some(body);
            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let conn = tokio::spawn(async move {
        let io = hyper_util::rt::TokioIo::new(server);
        let _ = hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD)
            .max_header_size(MAX_HEAD)
            .serve_connection(io, service)
            .with_upgrades()
            .await;
    });
    let mut out = Vec::new();
    let mut closed = false;
    if client.write_all(input).await.is_ok() {
        loop {
            match tokio::time::timeout(IDLE, client.read_buf(&mut out)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                Ok(Ok(_)) => {}
                Err(_) => break,
            }
        }
    }
    // Cancelled and waited for here, so that the connection's task, and the pipe whose wakers
    // point back at it, are gone before the next input rather than left for a later poll.
    conn.abort();
    let _ = conn.await;
    let served = served.lock().expect("not poisoned").clone();
    let answers = answers(&out, &served);
    ServerRun {
        served,
        answers,
        closed,
    }
}

/// The responses hyper's server wrote to the requests it `served`: status, and whether each
/// keeps the connection open (`Connection: keep-alive` on HTTP/1.0, no `close` on HTTP/1.1).
/// An answer to `HEAD` carries its `Content-Length` but no body.
fn answers(mut out: &[u8], served: &[Served]) -> Vec<(u16, bool)> {
    let mut found = Vec::new();
    // Final answers so far: the next one answers `served[finals]`.
    let mut finals = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut res = httparse::Response::new(&mut headers);
        let Ok(httparse::Status::Complete(len)) = res.parse(out) else {
            return found;
        };
        let status = res.code.unwrap_or(0);
        let http10 = res.version == Some(0);
        let connection = |token: &str| {
            res.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("connection")
                    && String::from_utf8_lossy(h.value)
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case(token))
            })
        };
        let open = if http10 {
            connection("keep-alive")
        } else {
            !connection("close")
        };
        let informational = (100..200).contains(&status);
        let to_head = !informational && served.get(finals).is_some_and(|s| s.method == "HEAD");
        let body = if to_head {
            0
        } else {
            res.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                .unwrap_or(0)
        };
        if !informational {
            finals += 1;
        }
        found.push((status, open));
        out = out.get(len + body..).unwrap_or_default();
    }
}

/// The fields of a plain head as hyper's `HeaderMap` holds them: lowercase names grouped in
/// the order each name first appears, values in order, a repeated equal `Content-Length`
/// once (hyper keeps only the first).
fn grouped(buf: &[u8], fields: &[wire::Field]) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = Vec::new();
    let mut values: Vec<Vec<Vec<u8>>> = Vec::new();
    for field in fields {
        let name = String::from_utf8_lossy(&buf[field.name.clone()]).to_ascii_lowercase();
        let value = buf[field.value.clone()].to_vec();
        match names.iter().position(|n| *n == name) {
            Some(_) if name == "content-length" => {}
            Some(i) => values[i].push(value),
            None => {
                names.push(name);
                values.push(vec![value]);
            }
        }
    }
    names
        .into_iter()
        .zip(values)
        .flat_map(|(n, vs)| vs.into_iter().map(move |v| (n.clone(), v)))
        .collect()
}

/// Walks `input` with `wire::Request::parse` and checks every plain request against what
/// hyper's server did with the same bytes. `Ok` carries wire's verdicts, one per request.
pub fn check_request(input: &[u8], run: &ServerRun) -> Result<Vec<String>, String> {
    let mut verdicts = Vec::new();
    let mut at = 0;
    for i in 0.. {
        if at == input.len() {
            if run.served.len() != i {
                return Err(format!(
                    "wire read {i} requests, hyper served {}",
                    run.served.len()
                ));
            }
            return Ok(verdicts);
        }
        let rest = &input[at..];
        let head = match wire::Request::parse(rest, MAX_HEAD) {
            wire::Request::Partial => {
                verdicts.push("Partial".to_owned());
                if run.served.len() != i || run.answers.len() != i {
                    return Err(format!(
                        "wire waits for request {i}, hyper: {}",
                        run.verdict()
                    ));
                }
                return Ok(verdicts);
            }
            wire::Request::Other(why) => {
                let handed = if run.served.len() > i {
                    " (handed to hyper)"
                } else {
                    ""
                };
                // A head over the limit is one hyper refuses too, wherever it stands on the
                // connection.
                if why == wire::Other::TooLarge
                    && run.answers.get(i).map(|&(status, _)| status) != Some(431)
                {
                    return Err(format!(
                        "request {i}: wire finds its head too large, hyper: {}",
                        run.verdict()
                    ));
                }
                verdicts.push(format!("Other({why:?}){handed}"));
                return Ok(verdicts);
            }
            wire::Request::Plain(head) => head,
        };
        verdicts.push("Plain".to_owned());
        let Some(seen) = run.served.get(i) else {
            return Err(format!(
                "wire says request {i} is plain, hyper did not serve it: {}",
                run.verdict()
            ));
        };
        let method = String::from_utf8_lossy(&rest[head.method.clone()]);
        let target = String::from_utf8_lossy(&rest[head.target.clone()]);
        if seen.method != method || seen.uri != target || seen.http10 != head.http10 {
            return Err(format!(
                "request {i}: wire read {method} {target} (1.0: {}), hyper {} {} (1.0: {})",
                head.http10, seen.method, seen.uri, seen.http10
            ));
        }
        // The fields as the byte path forwards them: the map `h1::request` makes of the head
        // (`None`: `http` refuses a part, and the byte path hands the request to hyper).
        let bytes = bytes::Bytes::copy_from_slice(&rest[..head.len]);
        let fields = match sluice_http::h1::request(&bytes, &head, http::HeaderMap::new()) {
            Some(request) => request
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            None => grouped(rest, &head.fields),
        };
        if fields != seen.headers {
            return Err(format!(
                "request {i}: the byte path's fields {fields:?}, hyper {:?}",
                seen.headers
            ));
        }
        let (length, decoded) = match head.framing {
            Framing::Empty => (0, None),
            Framing::Length(n) => (usize::try_from(n).unwrap_or(usize::MAX), None),
            Framing::Chunked => match wire::dechunk(&rest[head.len..], usize::MAX) {
                wire::Dechunked::Whole { data, len, .. } => (len, Some(data)),
                wire::Dechunked::Partial => (usize::MAX, None),
                wire::Dechunked::Broken => {
                    // Chunks `wire` does not read whole: the byte path hands the connection to
                    // hyper from this request on, so whatever hyper makes of them stands.
                    verdicts.push("chunks broken (left to hyper)".to_owned());
                    return Ok(verdicts);
                }
            },
            other => return Err(format!("request {i}: wire framing {other:?}")),
        };
        let body_end = head.len.saturating_add(length);
        if body_end > rest.len() {
            // The body is not all here: hyper must still be reading it.
            if seen.body.is_some() || run.served.len() != i + 1 {
                return Err(format!(
                    "request {i}: body incomplete for wire, hyper: {seen:?}"
                ));
            }
            return Ok(verdicts);
        }
        let body = match &decoded {
            Some(data) => &data[..],
            None => &rest[head.len..body_end],
        };
        if seen.body.as_ref().map(|b| b.as_deref()) != Some(Ok(body)) {
            return Err(format!(
                "request {i}: wire body {body:?}, hyper {:?}",
                seen.body
            ));
        }
        let Some(&(status, open)) = run.answers.get(i) else {
            return Err(format!("request {i}: hyper wrote no answer"));
        };
        if status != 200 || open != head.keep_alive {
            return Err(format!(
                "request {i}: wire keep-alive {}, hyper answered {status} keep-alive {open}",
                head.keep_alive
            ));
        }
        if !head.keep_alive {
            if run.served.len() != i + 1 || !run.closed {
                return Err(format!(
                    "request {i}: wire closes after it, hyper: {}",
                    run.verdict()
                ));
            }
            return Ok(verdicts);
        }
        at += body_end;
    }
    unreachable!("the loop returns")
}

/// Runs the request differential on `input`, panicking with the input on a divergence.
pub fn request_differential(runtime: &Runtime, input: &[u8]) -> (String, Vec<String>) {
    let run = runtime.block_on(serve(input));
    match check_request(input, &run) {
        Ok(verdicts) => (run.verdict(), verdicts),
        Err(why) => panic!(
            "wire and hyper differ on {:?}: {why}",
            String::from_utf8_lossy(input)
        ),
    }
}

/// A response head as hyper's client read it: status, HTTP/1.0 or not, and the fields as
/// its `HeaderMap` holds them.
pub type ResponseSeen = (u16, bool, Vec<(String, Vec<u8>)>);

/// What hyper's client made of a response.
#[derive(Debug, Clone, Default)]
pub struct ClientRun {
    /// The head: status, HTTP/1.0 or not, fields as the `HeaderMap` holds them; `Err` if hyper
    /// refused it; `None` if it was still waiting for it.
    pub head: Option<Result<ResponseSeen, String>>,
    /// The body's bytes as read before the upstream closed, and whether it had ended.
    pub body_before_close: (Vec<u8>, Option<Result<(), String>>),
    /// Whether the connection had ended (no keep-alive) before the upstream closed.
    pub conn_done_before_close: bool,
    /// The body's bytes and end once the upstream closed.
    pub body_after_close: (Vec<u8>, Option<Result<(), String>>),
}

impl ClientRun {
    /// A short account for the corpus table.
    pub fn verdict(&self) -> String {
        match &self.head {
            None => "no head".to_owned(),
            Some(Err(e)) => format!("refused ({e})"),
            Some(Ok((status, _, _))) => {
                let end = |e: &Option<Result<(), String>>| match e {
                    None => "open".to_owned(),
                    Some(Ok(())) => "ended".to_owned(),
                    Some(Err(_)) => "failed".to_owned(),
                };
                format!(
                    "{status}, body {} bytes {}, then {} bytes {}{}",
                    self.body_before_close.0.len(),
                    end(&self.body_before_close.1),
                    self.body_after_close.0.len(),
                    end(&self.body_after_close.1),
                    if self.conn_done_before_close {
                        ", conn closed"
                    } else {
                        ""
                    }
                )
            }
        }
    }
}

type BodyState = Arc<Mutex<(Vec<u8>, Option<Result<(), String>>)>>;

/// Sends one request (`HEAD` or `GET`) through hyper's HTTP/1.1 client to an upstream that
/// answers with `input`, then closes.
pub async fn fetch(input: &[u8], head_request: bool) -> ClientRun {
    let (client, mut upstream) = tokio::io::duplex(input.len().max(1 << 16) * 2);
    let mut run = ClientRun::default();
    let Ok((mut sender, conn)) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .handshake::<_, Empty<Bytes>>(hyper_util::rt::TokioIo::new(client))
        .await
    else {
        return run;
    };
    let conn = tokio::spawn(conn);
    let method = if head_request {
        http::Method::HEAD
    } else {
        http::Method::GET
    };
    let request = http::Request::builder()
        .method(method)
        .uri("/")
        .header("host", "upstream")
        .body(Empty::new())
        .expect("a valid request");
    let response = tokio::spawn(sender.send_request(request));
    // The upstream reads the request head, then answers.
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(IDLE, upstream.read_buf(&mut got)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return run,
        }
    }
    let _ = upstream.write_all(input).await;
    let body: BodyState = Arc::default();
    let reader = {
        let body = Arc::clone(&body);
        tokio::spawn(async move {
            let response = match response.await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(e) => return Err(e.to_string()),
            };
            let head = (
                response.status().as_u16(),
                response.version() == http::Version::HTTP_10,
                response
                    .headers()
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect(),
            );
            let head_for_body = head.clone();
            let mut incoming = response.into_body();
            tokio::spawn(async move {
                loop {
                    match incoming.frame().await {
                        Some(Ok(frame)) => {
                            if let Ok(data) = frame.into_data() {
                                body.lock()
                                    .expect("not poisoned")
                                    .0
                                    .extend_from_slice(&data);
                            }
                        }
                        Some(Err(e)) => {
                            body.lock().expect("not poisoned").1 = Some(Err(e.to_string()));
                            return;
                        }
                        None => {
                            body.lock().expect("not poisoned").1 = Some(Ok(()));
                            return;
                        }
                    }
                }
            });
            Ok(head_for_body)
        })
    };
    // Let the client do all it can before the upstream closes.
    let _ = tokio::time::timeout(IDLE, std::future::pending::<()>()).await;
    run.head = if reader.is_finished() {
        reader.await.ok()
    } else {
        None
    };
    run.body_before_close = body.lock().expect("not poisoned").clone();
    run.conn_done_before_close = conn.is_finished();
    drop(upstream);
    let _ = tokio::time::timeout(IDLE, std::future::pending::<()>()).await;
    run.body_after_close = body.lock().expect("not poisoned").clone();
    conn.abort();
    let _ = conn.await;
    run
}

/// Walks the response in `input` with `wire::Response::parse` and `wire::Chunks` and checks
/// it against what hyper's client made of the same bytes. `Ok` carries wire's verdict.
pub fn check_response(input: &[u8], head_request: bool, run: &ClientRun) -> Result<String, String> {
    let mut at = 0;
    let head = loop {
        match wire::Response::parse(&input[at..], head_request, MAX_HEAD) {
            wire::Response::Informational(len) => at += len,
            wire::Response::Partial => {
                return match &run.head {
                    Some(Ok(_)) => Err(format!("wire waits, hyper read {}", run.verdict())),
                    _ => Ok("Partial".to_owned()),
                }
            }
            wire::Response::Refused => return Ok("Refused".to_owned()),
            wire::Response::Final(head) => break head,
        }
    };
    let rest = &input[at..];
    let Some(Ok((status, http10, headers))) = &run.head else {
        return Err(format!(
            "wire reads a final {} head, hyper: {}",
            head.status,
            run.verdict()
        ));
    };
    let fields = grouped(rest, &head.fields);
    // hyper's client keeps every Content-Length line; compare the other fields.
    let strip = |f: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        f.iter()
            .filter(|(n, _)| n != "content-length")
            .cloned()
            .collect()
    };
    if *status != head.status || *http10 != head.http10 || strip(&fields) != strip(headers) {
        return Err(format!(
            "wire read {} (1.0: {}) {fields:?}, hyper {status} (1.0: {http10}) {headers:?}",
            head.status, head.http10
        ));
    }
    let after = &rest[head.len..];
    let verdict = format!("Final {:?} keep-alive {}", head.framing, head.keep_alive);
    let (wire_body, consumed): (Vec<u8>, Option<usize>) = match head.framing {
        Framing::Empty => (Vec::new(), Some(0)),
        Framing::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > after.len() {
                // Short: hyper must fail the body once the upstream closes.
                return match &run.body_after_close.1 {
                    Some(Err(_)) => Ok(verdict),
                    other => Err(format!("short body, hyper's body ended {other:?}")),
                };
            }
            (after[..n].to_vec(), Some(n))
        }
        Framing::UntilClose => (after.to_vec(), None),
        Framing::Chunked => {
            let mut state = Chunks::Size;
            let mut data = Vec::new();
            let mut used = 0;
            loop {
                if state == Chunks::Done {
                    break;
                }
                let was_data = matches!(state, Chunks::Data(_));
                match state.advance(&after[used..]) {
                    Step::Take(n) => {
                        if was_data {
                            data.extend_from_slice(&after[used..used + n]);
                        }
                        used += n;
                    }
                    Step::Broken => {
                        return match &run.body_after_close.1 {
                            Some(Err(_)) => Ok(format!("{verdict}, chunks Broken")),
                            other => Err(format!(
                                "wire finds the chunks broken, hyper's body ended {other:?}"
                            )),
                        };
                    }
                    Step::More => {
                        // The body is cut short: hyper must not have ended it well.
                        return match &run.body_after_close.1 {
                            Some(Ok(())) => Err(format!(
                                "wire waits for more chunks, hyper ended the body with {:?}",
                                run.body_after_close.0
                            )),
                            _ => Ok(format!("{verdict}, chunks cut short")),
                        };
                    }
                }
            }
            (data, Some(used))
        }
    };
    match consumed {
        Some(used) => {
            // The body ends within the bytes: hyper must have read it all before the close.
            if run.body_before_close != (wire_body.clone(), Some(Ok(()))) {
                return Err(format!(
                    "wire body {:?}, hyper {:?}",
                    String::from_utf8_lossy(&wire_body),
                    run.body_before_close
                ));
            }
            // With nothing after the response, the connection outlives it exactly when wire
            // says keep-alive.
            if used == after.len() && run.conn_done_before_close == head.keep_alive {
                return Err(format!(
                    "wire keep-alive {}, hyper's connection done: {}",
                    head.keep_alive, run.conn_done_before_close
                ));
            }
        }
        None => {
            if run.body_after_close != (wire_body.clone(), Some(Ok(()))) {
                return Err(format!(
                    "wire body to the close {:?}, hyper {:?}",
                    String::from_utf8_lossy(&wire_body),
                    run.body_after_close
                ));
            }
        }
    }
    Ok(verdict)
}

/// Runs the response differential, panicking with the input on a divergence.
pub fn response_differential(
    runtime: &Runtime,
    input: &[u8],
    head_request: bool,
) -> (String, String) {
    let run = runtime.block_on(fetch(input, head_request));
    match check_response(input, head_request, &run) {
        Ok(verdict) => (run.verdict(), verdict),
        Err(why) => panic!(
            "wire and hyper differ on {:?}: {why}",
            String::from_utf8_lossy(input)
        ),
    }
}
