//! An OpenAI-like upstream: the answers of the settled-cost suites (`settle`, `token_quota`),
//! on HTTP/1.1 and h2c, reporting the usage each request asks for.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A response body fed from a channel, frame by frame, as the upstream's handler sends them.
pub struct Chan(pub mpsc::Receiver<Frame<Bytes>>);

impl http_body::Body for Chan {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.to_owned())
    })
}

/// An OpenAI-like upstream on HTTP/1.1 and h2c. `?kind=` picks the answer:
/// `json` (a chat completion with `usage.total_tokens = tokens`), `silent` (the same without
/// usage), `sse` (`chunks` content events, then the usage event, then `[DONE]`; with
/// `stall=before` it stops before the usage event, with `stall=after` after it, holding the
/// stream open), `trailer` (a body, then the trailer `x-usage: tokens`), `header` (`x-usage`
/// in the head), `big` (`mib` MiB of events, then the usage event), `echo` (the request body's
/// length). A `POST` to a path ending in `/chat/completions` is a chat completion as
/// [`LlmUpstream`] describes.
pub async fn llm_upstream() -> String {
    LlmUpstream::start().await.addr
}

/// When each chat completion arrived, by its `x-test-call` header.
pub type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// The OpenAI-like upstream of [`llm_upstream`], with what it saw of its chat completions.
///
/// `POST .../chat/completions` reads an OpenAI request body (`model`, `stream`,
/// `stream_options.include_usage`) and answers as OpenAI's API does, reporting
/// `usage.total_tokens` = the request's `x-test-usage` header (default 100):
/// - `"stream": true`: server-sent events, content chunks spread over `x-test-stream-ms`
///   milliseconds (default 300), then with `include_usage` a last chunk with empty `choices`
///   and the usage, then `data: [DONE]`;
/// - otherwise: after `x-test-stream-ms`, a `chat.completion` JSON object with its usage.
///
/// The arrival of each request carrying `x-test-call` is recorded under that name: a bound on
/// when a gateway in front admitted it.
pub struct LlmUpstream {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub arrivals: Arrivals,
}

impl LlmUpstream {
    pub async fn start() -> LlmUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrivals = Arrivals::default();
        let seen = Arc::clone(&arrivals);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let seen = Arc::clone(&seen);
                        async move {
                            if let Some(call) = req.headers().get("x-test-call") {
                                let call = String::from_utf8_lossy(call.as_bytes()).into_owned();
                                seen.lock().unwrap().insert(call, Instant::now());
                            }
                            let chat = req.method() == http::Method::POST
                                && req.uri().path().ends_with("/chat/completions");
                            Ok::<_, Infallible>(if chat {
                                chat_completion(req).await
                            } else {
                                answer(req).await
                            })
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        LlmUpstream {
            addr: addr.to_string(),
            arrivals,
        }
    }

    /// When the request `x-test-call: call` arrived.
    pub fn arrival(&self, call: &str) -> Option<Instant> {
        self.arrivals.lock().unwrap().get(call).copied()
    }
}

fn header_number(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// An OpenAI `usage` object of `total` tokens.
pub fn usage_json(total: u64) -> String {
    format!(
        r#"{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{total}}}"#,
        p = total / 3,
        c = total - total / 3
    )
}

async fn chat_completion(req: Request<Incoming>) -> Response<Chan> {
    static N: AtomicU64 = AtomicU64::new(0);
    let id = format!("chatcmpl-{}", N.fetch_add(1, Ordering::Relaxed));
    let tokens = header_number(&req, "x-test-usage").unwrap_or(100);
    let over = Duration::from_millis(header_number(&req, "x-test-stream-ms").unwrap_or(300));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = body["model"].as_str().unwrap_or("test-model").to_owned();
    let stream = body["stream"].as_bool() == Some(true);
    let include_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
    let (tx, rx) = mpsc::channel::<Frame<Bytes>>(4);
    let mut response = Response::new(Chan(rx));
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    tokio::spawn(async move {
        let data = |s: String| Frame::data(Bytes::from(s));
        let usage = usage_json(tokens);
        if !stream {
            tokio::time::sleep(over).await;
            let _ = tx
                .send(data(format!(
                    r#"{{"id":"{id}","object":"chat.completion","model":"{model}","choices":[{{"index":0,"message":{{"role":"assistant","content":"an answer"}},"finish_reason":"stop"}}],"usage":{usage}}}"#
                )))
                .await;
            return;
        }
        // `usage: null` on every chunk but the last, as OpenAI sends them with include_usage.
        let null_usage = if include_usage {
            r#","usage":null"#
        } else {
            ""
        };
        const CHUNKS: u32 = 10;
        for i in 0..CHUNKS {
            tokio::time::sleep(over / CHUNKS).await;
            let finish = if i + 1 == CHUNKS { r#""stop""# } else { "null" };
            let chunk = format!(
                r#"data: {{"id":"{id}","object":"chat.completion.chunk","model":"{model}","choices":[{{"index":0,"delta":{{"content":"word {i} "}},"finish_reason":{finish}}}]{null_usage}}}"#
            );
            if tx.send(data(format!("{chunk}\n\n"))).await.is_err() {
                return;
            }
        }
        if include_usage {
            let _ = tx
                .send(data(format!(
                    r#"data: {{"id":"{id}","object":"chat.completion.chunk","model":"{model}","choices":[],"usage":{usage}}}"#
                ) + "\n\n"))
                .await;
        }
        let _ = tx.send(data("data: [DONE]\n\n".into())).await;
    });
    response
}

async fn answer(req: Request<Incoming>) -> Response<Chan> {
    let kind = query(&req, "kind").unwrap_or_default();
    let tokens: u64 = query(&req, "tokens")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Frame<Bytes>>(4);
    let mut response = Response::new(Chan(rx));
    let content_type = if matches!(kind.as_str(), "sse" | "big") {
        "text/event-stream"
    } else {
        "application/json"
    };
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    if kind == "trailer" {
        // An HTTP/1.1 answer announces its trailers (hyper sends only those announced).
        response
            .headers_mut()
            .insert("trailer", "x-usage".parse().unwrap());
    }
    if kind == "header" {
        response
            .headers_mut()
            .insert("x-usage", tokens.to_string().parse().unwrap());
    }
    let chunks: usize = query(&req, "chunks")
        .and_then(|c| c.parse().ok())
        .unwrap_or(3);
    let stall = query(&req, "stall").unwrap_or_default();
    let mib: usize = query(&req, "mib").and_then(|m| m.parse().ok()).unwrap_or(0);
    let body_len = if kind == "echo" {
        req.into_body()
            .collect()
            .await
            .map_or(0, |b| b.to_bytes().len())
    } else {
        0
    };
    tokio::spawn(async move {
        let data = |s: String| Frame::data(Bytes::from(s));
        let usage = usage_json(tokens);
        match kind.as_str() {
            "json" => {
                let _ = tx.send(data(r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"about \"usage\": {\"total_tokens\": 1}"}}],"#.into())).await;
                let _ = tx.send(data(format!(r#""usage":{usage}}}"#))).await;
            }
            "silent" | "header" => {
                let _ = tx.send(data(r#"{"choices":[]}"#.into())).await;
            }
            "echo" => {
                let _ = tx.send(data(format!(r#"{{"body_len":{body_len}}}"#))).await;
            }
            "sse" | "big" => {
                let event = |text: &str| {
                    format!(
                        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}],\"usage\":null}}\n\n"
                    )
                };
                if kind == "big" {
                    // 64 KiB of events per frame.
                    let one = event(&"x".repeat(100));
                    let frame = one.repeat(65_536 / one.len());
                    let mut sent = 0;
                    while sent < mib << 20 {
                        if tx.send(data(frame.clone())).await.is_err() {
                            return;
                        }
                        sent += frame.len();
                    }
                } else {
                    for i in 0..chunks {
                        let _ = tx.send(data(event(&format!("word {i}")))).await;
                    }
                }
                if stall == "before" {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let _ = tx
                    .send(data(format!(
                        "data: {{\"choices\":[],\"usage\":{usage}}}\n\n"
                    )))
                    .await;
                if stall == "after" {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let _ = tx.send(data("data: [DONE]\n\n".into())).await;
            }
            "trailer" => {
                let _ = tx.send(data(r#"{"choices":[]}"#.into())).await;
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-usage", tokens.to_string().parse().unwrap());
                let _ = tx.send(Frame::trailers(trailers)).await;
            }
            _ => {}
        }
    });
    response
}
