//! [`Browser`]: answers the browser paths on the main listener (the assets, the worker's
//! configuration, telemetry) for one configuration; rebuilt with it on reload.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCEPT_ENCODING, ALLOW, CACHE_CONTROL, CONTENT_ENCODING,
    CONTENT_LENGTH, CONTENT_TYPE, ETAG, IF_NONE_MATCH, RETRY_AFTER, VARY, X_CONTENT_TYPE_OPTIONS,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use sluice::Keyed;
use sluice_core::Gcra;
use sluice_http::body::Body;
use sluice_http::{headers, TrustedProxies};

use crate::browser::assets::{self, Coding};
use crate::browser::telemetry::{Batch, Metrics, Refusal, MAX_BATCH_BYTES};
use crate::config::BrowserConfig;

/// `Service-Worker-Allowed`.
static SERVICE_WORKER_ALLOWED: HeaderName = HeaderName::from_static("service-worker-allowed");

/// `X-Request-Id`.
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How long a client may take to send a telemetry body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The most client addresses the telemetry limit tracks at once.
const TELEMETRY_MAX_KEYS: usize = 10_000;

/// One embedded file, ready to send: plain, and compressed once in `br` and `gzip`.
#[derive(Debug)]
struct Asset {
    path: String,
    content_type: HeaderValue,
    /// The plain body, then its `br` and `gzip` forms, each with its entity tag.
    forms: [(Option<Coding>, Bytes, HeaderValue); 3],
    service_worker: bool,
    /// A content-hashed name: cached for a year, never revalidated.
    immutable: bool,
}

impl Asset {
    fn new(path: impl Into<String>, content_type: &'static str, body: Bytes) -> Asset {
        let path = path.into();
        let tag = etag(&body);
        let coded = |c: Coding| {
            let suffix = format!("-{}\"", c.token());
            let tagged = tag
                .to_str()
                .unwrap_or("\"0\"")
                .trim_end_matches('"')
                .to_owned()
                + &suffix;
            (
                Some(c),
                Bytes::from(c.compress(&body)),
                HeaderValue::from_str(&tagged).unwrap_or(HeaderValue::from_static("\"0\"")),
            )
        };
        Asset {
            service_worker: path == "/sluice/sw.js",
            immutable: false,
            forms: [
                coded(Coding::Brotli),
                coded(Coding::Gzip),
                (None, body, tag),
            ],
            path,
            content_type: HeaderValue::from_static(content_type),
        }
    }

    fn immutable(mut self) -> Asset {
        self.immutable = true;
        self
    }
}

/// The browser paths of one `[browser]` configuration.
///
/// # Examples
///
/// ```
/// use sluice_http::TrustedProxies;
/// use sluice_server::browser::Browser;
/// use sluice_server::config::BrowserConfig;
///
/// let browser = Browser::new(&BrowserConfig::default(), TrustedProxies::none());
/// assert!(browser.owns("/sluice/sw.js"));
/// assert!(browser.owns("/v1/telemetry"));
/// assert!(!browser.owns("/api/x"));
/// assert!(!browser.owns("/sluice/state")); // the worker answers that one itself
/// ```
#[derive(Debug)]
pub struct Browser {
    assets: Vec<Asset>,
    endpoint: Option<String>,
    limiter: Option<Keyed<IpAddr, Gcra>>,
    metrics: Metrics,
    trusted: TrustedProxies,
}

// === impl Browser ===

impl Browser {
    /// Prepares every answer of `config` (the served script is written once, here).
    /// `X-Forwarded-For` is believed from `trusted` for the telemetry limit's client address.
    pub fn new(config: &BrowserConfig, trusted: TrustedProxies) -> Browser {
        let json = config.worker_json().to_string();
        let js = "text/javascript; charset=utf-8";
        let assets = vec![
            Asset::new(
                "/sluice/sw.js",
                js,
                Bytes::from(assets::service_worker(&json)),
            ),
            Asset::new(
                "/sluice/client.js",
                js,
                Bytes::from_static(assets::CLIENT_JS.as_bytes()),
            ),
            Asset::new(
                "/sluice/demo.html",
                "text/html; charset=utf-8",
                Bytes::from_static(assets::DEMO_HTML.as_bytes()),
            ),
            Asset::new(
                "/sluice/demo.js",
                js,
                Bytes::from_static(assets::DEMO_JS.as_bytes()),
            ),
            Asset::new(
                "/sluice/sw-import.js",
                js,
                Bytes::from(assets::service_worker_import(&json)),
            ),
            Asset::new(
                "/sluice/sw.mjs",
                js,
                Bytes::from(assets::service_worker_module(&json)),
            ),
            Asset::new(
                assets::wasm_path(),
                "application/wasm",
                Bytes::from_static(assets::WASM),
            )
            .immutable(),
            Asset::new(
                "/sluice/config.json",
                "application/json",
                Bytes::from(json + "\n"),
            ),
        ];
        let limiter = config.telemetry.as_ref().map(|t| {
            Keyed::builder(Gcra::new(t.limit))
                .max_keys(TELEMETRY_MAX_KEYS)
                .name("browser_telemetry")
                .build::<IpAddr>()
        });
        Browser {
            assets,
            endpoint: config.telemetry.as_ref().map(|t| t.endpoint.clone()),
            limiter,
            metrics: Metrics::new(),
            trusted,
        }
    }

    /// Whether `path` is answered here rather than routed: the files under `/sluice/`
    /// and the telemetry endpoint. Other paths under `/sluice/` go to the routes.
    #[inline]
    pub fn owns(&self, path: &str) -> bool {
        (path.starts_with(crate::config::BROWSER_RESERVED_PREFIX)
            && self.assets.iter().any(|a| a.path == path))
            || self.endpoint.as_deref() == Some(path)
    }

    /// Answers a request for a path it [`owns`](Self::owns), with `id` as its
    /// `X-Request-Id`, and writes its access-log line.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request; a telemetry batch is counted only once read
    /// whole.
    pub async fn handle<B>(
        &self,
        req: Request<B>,
        peer: SocketAddr,
        id: Option<HeaderValue>,
        started: Instant,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let log = tracing::enabled!(target: "sluice::access", tracing::Level::INFO);
        let head = log.then(|| (req.method().clone(), req.uri().path().to_owned()));
        // Without an id of the gateway's (`request_id = false`), the client's is logged.
        let logged = log
            .then(|| {
                id.clone()
                    .or_else(|| req.headers().get(&X_REQUEST_ID).cloned())
            })
            .flatten();
        let client = self.trusted.client_ip(peer.ip(), req.headers());
        let (mut response, decision) = self.respond(req, client).await;
        if let Some(id) = &id {
            response
                .headers_mut()
                .insert(X_REQUEST_ID.clone(), id.clone());
        }
        if let Some((method, path)) = head {
            tracing::info!(
                target: "sluice::access",
                request_id = logged.as_ref().and_then(|id| id.to_str().ok()).unwrap_or(""),
                client = %client,
                method = %method,
                path = %path,
                status = response.status().as_u16(),
                decision = %decision,
                ms = %format_args!("{:.3}", started.elapsed().as_secs_f64() * 1e3),
            );
        }
        response
    }

    /// The answer and the access log's `decision`.
    async fn respond<B>(&self, req: Request<B>, client: IpAddr) -> (Response<Body>, &'static str)
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = req.uri().path();
        if let Some(asset) = self.assets.iter().find(|a| a.path == path) {
            return (self.asset(asset, &req), "browser_asset");
        }
        let response = self.telemetry(req, client).await;
        let decision = if response.status() == StatusCode::NO_CONTENT {
            "telemetry"
        } else {
            "telemetry_refused"
        };
        (response, decision)
    }

    fn asset<B>(&self, asset: &Asset, req: &Request<B>) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "this path answers GET and HEAD only",
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let coding = assets::negotiate(
            req.headers()
                .get_all(ACCEPT_ENCODING)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        );
        let (coding, body, tag) = asset
            .forms
            .iter()
            .find(|(c, _, _)| c.is_none() || *c == coding)
            .cloned()
            .unwrap_or((None, Bytes::new(), HeaderValue::from_static("\"0\"")));
        // Any form the client holds is current: the forms differ in coding only.
        let held = req
            .headers()
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|tag| tag.trim().trim_start_matches("W/"))
            .find_map(|held| {
                asset
                    .forms
                    .iter()
                    .find(|(_, _, t)| held == "*" || held.as_bytes() == t.as_bytes())
                    .map(|(_, _, t)| if held == "*" { tag.clone() } else { t.clone() })
            });
        let mut response = if let Some(held) = held {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r.headers_mut().insert(ETAG, held);
            r
        } else {
            let mut r = Response::new(Body::full(body));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, asset.content_type.clone());
            h.insert(ETAG, tag);
            if let Some(c) = coding {
                h.insert(CONTENT_ENCODING, HeaderValue::from_static(c.token()));
            }
            r
        };
        let h = response.headers_mut();
        h.insert(
            CACHE_CONTROL,
            HeaderValue::from_static(if asset.immutable {
                "public, max-age=31536000, immutable"
            } else {
                "no-cache"
            }),
        );
        h.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        if asset.service_worker {
            h.insert(
                SERVICE_WORKER_ALLOWED.clone(),
                HeaderValue::from_static("/"),
            );
        }
        response
    }

    async fn telemetry<B>(&self, req: Request<B>, client: IpAddr) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if req.method() != Method::POST {
            self.metrics.refused(Refusal::Method);
            let mut r = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "telemetry batches are POSTed",
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        if let Some(limiter) = &self.limiter {
            if let Err(e) = limiter.try_acquire(&sluice_http::client_ip::limit_address(client), 1) {
                self.metrics.refused(Refusal::Limit);
                let wait = e.retry_after().unwrap_or(Duration::from_secs(1));
                let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1);
                let ms = wait.as_nanos().div_ceil(1_000_000);
                let mut body = String::from(
                    "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
                     \"detail\":\"too many telemetry batches from this address\",\
                     \"reason\":\"limit\",\"retry_after_ms\":",
                );
                body.push_str(&ms.to_string());
                body.push_str("}\n");
                let mut r = Response::new(Body::full(body));
                *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let h = r.headers_mut();
                h.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                h.insert(RETRY_AFTER, HeaderValue::from(secs as u64));
                return r;
            }
        }
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BATCH_BYTES as u64) {
            self.metrics.refused(Refusal::TooLarge);
            return too_large();
        }
        let read = Limited::new(req.into_body(), MAX_BATCH_BYTES).collect();
        let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                self.metrics.refused(Refusal::TooLarge);
                return too_large();
            }
            Ok(Err(e)) => {
                self.metrics.refused(Refusal::Malformed);
                return problem(
                    StatusCode::BAD_REQUEST,
                    &format!("the body could not be read: {e}"),
                );
            }
            Err(_) => {
                self.metrics.refused(Refusal::Malformed);
                return problem(StatusCode::REQUEST_TIMEOUT, "the body took too long");
            }
        };
        match Batch::parse(&body) {
            Ok(batch) => {
                self.metrics.record(&batch);
                let mut r = Response::new(Body::empty());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            Err(e) => {
                self.metrics.refused(Refusal::Malformed);
                problem(StatusCode::BAD_REQUEST, &e.to_string())
            }
        }
    }
}

fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    headers::problem(status, detail).map(Body::from)
}

fn too_large() -> Response<Body> {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "a telemetry batch is at most 1 KiB",
    )
}

/// A strong entity tag: 64-bit FNV-1a of the body (stable for a given build and config).
fn etag(body: &[u8]) -> HeaderValue {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in body {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    HeaderValue::from_str(&format!("\"{h:016x}-{:x}\"", body.len()))
        .unwrap_or(HeaderValue::from_static("\"0\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TelemetryConfig;
    use http_body_util::Full;
    use sluice_core::Quota;

    fn browser(limit: Quota) -> Browser {
        let config = BrowserConfig {
            telemetry: Some(TelemetryConfig {
                limit,
                ..TelemetryConfig::default()
            }),
            ..BrowserConfig::default()
        };
        Browser::new(&config, TrustedProxies::none())
    }

    async fn send(b: &Browser, req: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, Bytes) {
        let (r, _) = b.respond(req, "192.0.2.1".parse().unwrap()).await;
        let (parts, body) = r.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    }

    fn get(path: &str) -> Request<Full<Bytes>> {
        Request::get(path).body(Full::default()).unwrap()
    }

    fn post(path: &str, body: &str) -> Request<Full<Bytes>> {
        Request::post(path)
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap()
    }

    const BATCH: &str = r#"{"v":1,"worker":"w","seq":1,"sample":1,"window_ms":1000,"admitted":1,"queued":0,"rejected":{"queue_full":0,"timeout":0,"limit":0},"cancelled":0,"redispatched":0,"wait_ms":{"sum":0,"count":0,"max":0}}"#;

    #[tokio::test]
    async fn assets_with_etags() {
        let b = browser(Quota::parse(50, "10/s").unwrap());
        let (status, h, body) = send(&b, get("/sluice/sw.js")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h["service-worker-allowed"], "/");
        assert_eq!(h["content-type"], "text/javascript; charset=utf-8");
        assert_eq!(h["cache-control"], "no-cache");
        assert!(body.starts_with(assets::PREFIX_COMMENT.as_bytes()));
        let tag = h["etag"].clone();
        let mut again = get("/sluice/sw.js");
        again.headers_mut().insert(IF_NONE_MATCH, tag.clone());
        let (status, h, body) = send(&b, again).await;
        assert_eq!((status, body.len()), (StatusCode::NOT_MODIFIED, 0));
        assert_eq!(h["etag"], tag);
        let (status, h, _) = send(&b, get("/sluice/demo.html")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!h.contains_key("service-worker-allowed"));
        let (status, h, _) = send(&b, post("/sluice/client.js", "")).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(h["allow"], "GET, HEAD");
    }

    #[tokio::test]
    async fn telemetry_statuses() {
        // Three batches an hour: the fourth request is refused, whatever it is.
        let b = browser(Quota::parse(3, "1/h").unwrap());
        let ok = send(&b, post("/v1/telemetry", BATCH)).await.0;
        assert_eq!(ok, StatusCode::NO_CONTENT);
        let malformed = send(&b, post("/v1/telemetry", "{")).await.0;
        assert_eq!(malformed, StatusCode::BAD_REQUEST);
        let big = format!("{}{}", BATCH, " ".repeat(1024));
        let large = send(&b, post("/v1/telemetry", &big)).await.0;
        assert_eq!(large, StatusCode::PAYLOAD_TOO_LARGE);
        let (status, h, body) = send(&b, post("/v1/telemetry", BATCH)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let secs: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((3590..=3600).contains(&secs), "{secs}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["reason"], "limit");
        assert!(json["retry_after_ms"].as_u64().unwrap() > 3_590_000);
        let get = send(&b, get("/v1/telemetry")).await.0;
        assert_eq!(get, StatusCode::METHOD_NOT_ALLOWED);
    }
}
