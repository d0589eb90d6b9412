//! [`RateLimitLayer`].

use std::net::IpAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use tower_layer::Layer;

use crate::client_ip::TrustedProxies;
use crate::limit::service::RateLimit;
use crate::policy::Policy;

/// Finds a request's peer address in its extensions.
pub type PeerFn = fn(&http::Extensions) -> Option<IpAddr>;

/// What every clone of the middleware shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) policies: Vec<Arc<Policy>>,
    pub(crate) policy_header: Option<HeaderValue>,
    pub(crate) trusted: TrustedProxies,
    pub(crate) peer: Option<PeerFn>,
    pub(crate) may_wait: bool,
}

/// Applies [`RateLimit`] to a service. See the [module docs](crate::limit).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// Limits by one policy.
    pub fn new(policy: Arc<Policy>) -> RateLimitLayer {
        RateLimitLayer::with_policies(vec![policy])
    }

    /// Limits by several policies, which must all admit (see [`crate::admit`] for the order).
    pub fn with_policies(policies: Vec<Arc<Policy>>) -> RateLimitLayer {
        RateLimitLayer {
            shared: Arc::new(Shared {
                policy_header: crate::headers::policy_header(&policies),
                policies,
                trusted: TrustedProxies::none(),
                peer: None,
                may_wait: true,
            }),
        }
    }

    /// Believes `X-Forwarded-For` from these peers.
    pub fn trusted_proxies(self, trusted: TrustedProxies) -> RateLimitLayer {
        self.map(|s| s.trusted = trusted)
    }

    /// Finds the peer address with `peer` when there is no [`ClientIp`](crate::ClientIp) or
    /// `SocketAddr` extension (for example axum's `ConnectInfo`).
    pub fn client_ip(self, peer: PeerFn) -> RateLimitLayer {
        self.map(|s| s.peer = Some(peer))
    }

    /// Whether requests may wait in the policies' queues (default: yes). Without, a policy
    /// with a queue denies at once.
    pub fn wait(self, may_wait: bool) -> RateLimitLayer {
        self.map(|s| s.may_wait = may_wait)
    }

    fn map(self, f: impl FnOnce(&mut Shared)) -> RateLimitLayer {
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| Shared {
            policies: shared.policies.clone(),
            policy_header: shared.policy_header.clone(),
            trusted: shared.trusted.clone(),
            peer: shared.peer,
            may_wait: shared.may_wait,
        });
        f(&mut shared);
        RateLimitLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}
