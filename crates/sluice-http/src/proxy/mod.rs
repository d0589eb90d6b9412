//! The reverse proxy: pooled hyper 1 HTTP/1.1 connections (over TCP for `http://`, over TLS
//! for `https://`), one multiplexed HTTP/2 connection per `h2c://` upstream, streaming bodies
//! (and HTTP/2 trailers) both ways.
//!
//! Requests and responses lose their hop-by-hop headers (`Connection` and every header it
//! names, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`; `TE:
//! trailers` is kept towards an HTTP/2 upstream); requests gain the peer's address at the end
//! of `X-Forwarded-For`. The `Host` header is passed on unchanged, but for a target that names
//! its host (an absolute-form target, an HTTP/2 client's `:authority`), whose host replaces it,
//! and set to the upstream's when missing; towards an HTTP/2 upstream it becomes `:authority`. A refused or failed connection is [`ProxyError::Connect`],
//! [`ProxyError::Tls`] or [`ProxyError::Upstream`] (502), no response head within the route's
//! timeout is [`ProxyError::Timeout`] (504). A request a pooled connection could not send
//! (the upstream had closed it) is sent again on a new one.
//!
//! The byte path ([`crate::h1`]) keeps its own pool of plain connections, each
//! watched while idle: one the upstream closes leaves the pool at once.
//!
//! An upgrade request (WebSocket) goes on an HTTP/1.1 connection of its own
//! ([`forward_upgrade`]), keeping `Upgrade` and `Connection: upgrade`.
//!
//! Every upstream socket counts against the process's budget ([`set_upstream_budget`]), and
//! the requests of one client connection carrying an [`UpstreamShare`] take turns for its
//! shares: beyond either, [`ProxyError::Budget`] (503).

mod budget;
mod client;
mod forward;
mod raw;
mod tls;
mod upgrade;

pub use budget::{describe_metrics, set_upstream_budget, upstream_open, UpstreamShare};
pub(crate) use client::h1_upstream_headers;
pub use client::{Lease, Proxy, ProxyError};
pub(crate) use forward::is_hop_by_hop_bytes;
pub use forward::{append_forwarded_for, remove_hop_by_hop};
pub(crate) use raw::RawConn;
pub use tls::{client_config, pem_certificates, provider, TlsError};
pub use upgrade::forward_upgrade;
