//! What a request speaks, decided once per request from its version and head: the
//! `protocol` label of the gateway's metrics, and whether its refusals are written as gRPC
//! statuses ([`crate::grpc`]) and its upgrade is tunnelled.

use http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use http::{Method, Request, Version};

/// The protocol of a request, as the gateway's metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HTTP/1.0 or HTTP/1.1 (`http1`).
    Http1 = 0,
    /// HTTP/2, not gRPC (`h2`).
    H2 = 1,
    /// gRPC, over either (`grpc`): a `content-type` of `application/grpc` or
    /// `application/grpc+…` / `application/grpc-web…`.
    Grpc = 2,
    /// A WebSocket: an HTTP/1.1 upgrade (`Upgrade: websocket` with `Connection: upgrade`),
    /// or an HTTP/2 extended `CONNECT` with `:protocol` `websocket` (RFC 8441) (`ws`).
    Ws = 3,
}

impl Protocol {
    /// Every protocol, in label order.
    pub const ALL: [Protocol; 4] = [Protocol::Http1, Protocol::H2, Protocol::Grpc, Protocol::Ws];

    /// The label: `http1`, `h2`, `grpc`, `ws`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::H2 => "h2",
            Protocol::Grpc => "grpc",
            Protocol::Ws => "ws",
        }
    }

    /// The protocol of `request`. A plain HTTP/1.1 request costs one header lookup
    /// (`content-type`) and one look at its (empty) extensions.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_http::protocol::Protocol;
    ///
    /// let grpc = http::Request::post("/pkg.Svc/Call")
    ///     .version(http::Version::HTTP_2)
    ///     .header("content-type", "application/grpc+proto")
    ///     .body(())?;
    /// assert_eq!(Protocol::of(&grpc), Protocol::Grpc);
    /// let plain = http::Request::get("/").body(())?;
    /// assert_eq!(Protocol::of(&plain), Protocol::Http1);
    /// # Ok::<(), http::Error>(())
    /// ```
    #[inline]
    pub fn of<B>(request: &Request<B>) -> Protocol {
        if let Some(ct) = request.headers().get(CONTENT_TYPE) {
            if is_grpc_content_type(ct.as_bytes()) {
                return Protocol::Grpc;
            }
        }
        match request.version() {
            // RFC 8441: hyper gives an extended CONNECT's `:protocol` as an extension.
            Version::HTTP_2
                if request.method() == Method::CONNECT && is_websocket_connect(request) =>
            {
                Protocol::Ws
            }
            Version::HTTP_2 | Version::HTTP_3 => Protocol::H2,
            // hyper marks an HTTP/1.1 request with an `Upgrade` field with an `OnUpgrade`
            // extension: other requests have none, and the look is a null check. An upgrade
            // also needs `Connection: upgrade` (RFC 9110 §7.8).
            _ if request
                .extensions()
                .get::<hyper::upgrade::OnUpgrade>()
                .is_some()
                && asks_websocket_upgrade(request.headers()) =>
            {
                Protocol::Ws
            }
            _ => Protocol::Http1,
        }
    }
}

/// Whether an HTTP/1.1 request's headers ask for a WebSocket upgrade: `Upgrade: websocket`
/// with `Connection: upgrade` (each among comma-separated tokens, in any case). What
/// [`Protocol::of`] looks for once hyper has marked the request as an upgrade; a request
/// described rather than received (an explanation) has only its headers to show.
pub fn asks_websocket_upgrade(headers: &http::HeaderMap) -> bool {
    has_token(headers.get_all(UPGRADE), b"websocket")
        && has_token(headers.get_all(CONNECTION), b"upgrade")
}

/// Whether `request` carries the `:protocol` `websocket` of an extended `CONNECT` (RFC 8441
/// §4), in any case.
fn is_websocket_connect<B>(request: &Request<B>) -> bool {
    request
        .extensions()
        .get::<hyper::ext::Protocol>()
        .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// What a `CONNECT` request is to the gateway, which tunnels WebSocket only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// An extended `CONNECT` (RFC 8441) for WebSocket: tunnelled.
    WebSocket,
    /// An extended `CONNECT` for another protocol (501).
    OtherProtocol,
    /// A plain `CONNECT` (a forward proxy's tunnel to `host:port`; 405).
    Plain,
}

impl Connect {
    /// What `request`, a `CONNECT`, asks for.
    pub fn of<B>(request: &Request<B>) -> Connect {
        if is_websocket_connect(request) {
            Connect::WebSocket
        } else if request.extensions().get::<hyper::ext::Protocol>().is_some() {
            Connect::OtherProtocol
        } else {
            Connect::Plain
        }
    }
}

/// Whether one of the comma-separated tokens of `values` is `token`, in any case.
fn has_token(values: http::header::GetAll<'_, http::HeaderValue>, token: &[u8]) -> bool {
    values.iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
    })
}

/// Whether a `content-type` value is gRPC's: `application/grpc`, followed by nothing, `+`
/// (a message format), `-` (`grpc-web`) or `;` (parameters), in any case.
#[inline]
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b'-' | b';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc-web+proto",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_grpc_content_type(yes.as_bytes()), "{yes}");
        }
        for no in ["application/grpcx", "application/json", "text/grpc", ""] {
            assert!(!is_grpc_content_type(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn upgrade_tokens() {
        let mut h = http::HeaderMap::new();
        h.append(CONNECTION, "keep-alive".parse().unwrap());
        h.append(CONNECTION, "x-a, Upgrade".parse().unwrap());
        h.append(UPGRADE, "h2c".parse().unwrap());
        assert!(has_token(h.get_all(CONNECTION), b"upgrade"));
        assert!(!has_token(h.get_all(UPGRADE), b"websocket"));
        h.insert(UPGRADE, "foo/1, WebSocket".parse().unwrap());
        assert!(has_token(h.get_all(UPGRADE), b"websocket"));
    }

    #[test]
    fn requests_are_labelled_by_version_and_head() {
        let h2 = Request::get("/").version(Version::HTTP_2).body(()).unwrap();
        assert_eq!(Protocol::of(&h2), Protocol::H2);
        let grpc_web = Request::post("/s/m")
            .header("content-type", "application/grpc-web")
            .body(())
            .unwrap();
        assert_eq!(Protocol::of(&grpc_web), Protocol::Grpc);
        // An `Upgrade` header hyper did not accept as an upgrade is a plain request.
        let fake = Request::get("/")
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        assert_eq!(Protocol::of(&fake), Protocol::Http1);
        let mut ws = Request::connect("https://example.com/chat")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        assert_eq!(Protocol::of(&ws), Protocol::H2);
        assert_eq!(Connect::of(&ws), Connect::Plain);
        ws.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("WebSocket"));
        assert_eq!(Protocol::of(&ws), Protocol::Ws);
        assert_eq!(Connect::of(&ws), Connect::WebSocket);
        ws.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("connect-udp"));
        assert_eq!(Protocol::of(&ws), Protocol::H2);
        assert_eq!(Connect::of(&ws), Connect::OtherProtocol);
        let labels: Vec<_> = Protocol::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(labels, ["http1", "h2", "grpc", "ws"]);
    }
}
