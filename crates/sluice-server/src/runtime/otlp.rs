//! `[telemetry] otlp_endpoint`: one span per gateway request, exported over OTLP/HTTP
//! (protobuf, `POST <endpoint>/v1/traces`) by a batch span processor on the main tokio
//! runtime.
//!
//! The span (`sluice.request`, kind SERVER) is a child of the request's W3C `traceparent`
//! when it is valid, so its trace id is the caller's (the access log's `trace_id`); the
//! headers themselves go upstream untouched (no new `traceparent` is injected). The SDK's
//! default sampler follows the caller's sampled flag and samples every request without one.
//! Without `otlp_endpoint` none of this exists: the request path checks one `Option`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use http::{HeaderMap, Method, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use sluice_http::gateway::Outcome;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::OtlpConfig;

/// How long one export (a POST to the collector) may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a graceful shutdown waits for the last spans to be sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The span name of a gateway request.
pub const SPAN_NAME: &str = "sluice.request";

/// The exporter and the tracer the gateway's requests use.
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    endpoint: String,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// What a request's span records, taken before the request goes to the gateway.
#[derive(Debug)]
pub struct Started {
    parent: Context,
    method: Method,
    path: String,
    at: SystemTime,
}

impl Spans {
    /// Starts the exporter for `config`, or `None` without `otlp_endpoint`. Must run inside
    /// the main tokio runtime (the batch processor's task is spawned on it).
    ///
    /// # Errors
    ///
    /// When the exporter cannot be built (no root certificate for an `https://` endpoint).
    pub fn start(config: &OtlpConfig) -> anyhow::Result<Option<Spans>> {
        let Some(url) = config.traces_url() else {
            return Ok(None);
        };
        let tls = if url.starts_with("https://") {
            Some(
                sluice_http::proxy::client_config(None)
                    .context("telemetry.otlp_endpoint: TLS to the collector")?,
            )
        } else {
            None
        };
        let client =
            opentelemetry_http::hyper::HyperClient::new(Connector { tls }, EXPORT_TIMEOUT, None);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .context("telemetry.otlp_endpoint: building the span exporter")?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        // The service is `sluice` unless OTEL_SERVICE_NAME names it (the SDK reads it, and
        // OTEL_RESOURCE_ATTRIBUTES, in `Resource::builder`).
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("sluice");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("sluice");
        Ok(Some(Spans {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            endpoint: url,
        }))
    }

    /// Where spans go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What the span of a request with these parts needs from it before it is handled: the
    /// parent from its `traceparent` / `tracestate` (read, not changed), its method and path.
    pub fn start_request(&self, method: &Method, path: &str, headers: &HeaderMap) -> Started {
        let parent = self
            .propagator
            .extract(&opentelemetry_http::HeaderExtractor(headers));
        Started {
            parent,
            method: method.clone(),
            path: path.to_owned(),
            at: SystemTime::now(),
        }
    }

    /// Records the span of a handled request, ending now.
    pub fn finish_request(
        &self,
        started: Started,
        status: u16,
        route: Option<&str>,
        outcome: &Outcome<'_>,
    ) {
        let mut attributes = Vec::with_capacity(6);
        attributes.push(KeyValue::new(
            "http.request.method",
            started.method.as_str().to_owned(),
        ));
        attributes.push(KeyValue::new("url.path", started.path));
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if let Some(route) = route {
            attributes.push(KeyValue::new("sluice.route", route.to_owned()));
        }
        attributes.push(KeyValue::new("sluice.decision", outcome.to_string()));
        if let Outcome::Denied { policy, .. } | Outcome::ShadowDenied { policy, .. } = outcome {
            attributes.push(KeyValue::new("sluice.policy", (*policy).to_owned()));
        }
        let mut span = self
            .tracer
            .span_builder(SPAN_NAME)
            .with_kind(SpanKind::Server)
            .with_start_time(started.at)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &started.parent);
        // A server span is an error for answers of the 5xx class only (semantic conventions).
        if status >= 500 {
            span.set_status(Status::error(""));
        }
        span.end();
    }

    /// Sends the spans not yet exported and stops the exporter, waiting at most
    /// `FLUSH_TIMEOUT` (5 s).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        // The processor's shutdown blocks until its task (on this runtime) has exported.
        let done = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(FLUSH_TIMEOUT, done).await {
            Ok(Ok(Ok(()))) => tracing::debug!("spans flushed"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "flushing the spans failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing the spans failed"),
            Err(_) => tracing::warn!(timeout = ?FLUSH_TIMEOUT, "flushing the spans timed out"),
        }
    }
}

/// Connects to the collector: plain TCP for `http://`, rustls (ring) for `https://`.
#[derive(Clone, Debug)]
struct Connector {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Stream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::other("the collector URL has no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            if !https {
                return Ok(TokioIo::new(Stream::Plain(tcp)));
            }
            let config = tls.ok_or_else(|| io::Error::other("no TLS configuration"))?;
            let name = rustls_pki_types::ServerName::try_from(host)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(Stream::Tls(Box::new(stream))))
        })
    }
}

/// A connection to the collector.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
