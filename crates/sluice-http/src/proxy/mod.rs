//! The reverse proxy: a pooled hyper 1 client, streaming bodies both ways.
//!
//! Requests and responses lose their hop-by-hop headers (`Connection` and every header it
//! names, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`); requests
//! gain the peer's address at the end of `X-Forwarded-For`. The `Host` header is passed on
//! unchanged. A refused or failed connection is [`ProxyError::Refused`] (502), no response
//! head within the route's timeout is [`ProxyError::Timeout`] (504).

mod client;
mod forward;

pub use client::{Proxy, ProxyError};
pub use forward::{append_forwarded_for, remove_hop_by_hop};
