//! The reverse proxy: pooled hyper 1 HTTP/1.1 connections, streaming bodies both ways.
//!
//! Requests and responses lose their hop-by-hop headers (`Connection` and every header it
//! names, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`); requests
//! gain the peer's address at the end of `X-Forwarded-For`. The `Host` header is passed on
//! unchanged (set to the upstream's when missing). A refused or failed connection is
//! [`ProxyError::Connect`] or [`ProxyError::Upstream`] (502), no response
//! head within the route's timeout is [`ProxyError::Timeout`] (504). A request a pooled
//! connection could not send (the upstream had closed it) is sent again on a new one.
//!
//! An upgrade request (WebSocket) goes on a connection of its own ([`forward_upgrade`]),
//! keeping `Upgrade` and `Connection: upgrade`.

mod client;
mod forward;
mod upgrade;

pub use client::{Lease, Proxy, ProxyError};
pub use forward::{append_forwarded_for, remove_hop_by_hop};
pub use upgrade::forward_upgrade;
