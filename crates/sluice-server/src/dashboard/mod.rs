//! The live dashboard on the admin listener: `GET /dashboard` and its data, `GET /v1/stats`.
//!
//! The page ([`page`]) is one self-contained HTML document (style and script inlined with
//! `include_str!`, no CDN, no fonts, works offline) that polls `/v1/stats` every second and
//! shows, per policy, the admitted and denied rates (denials by reason), the requests waiting
//! in its queues, queue-wait percentiles, a two-minute chart and the hottest keys with their
//! bucket levels; per route, the upstream answers; and the browser telemetry counters
//! (`sluice_browser_*`) when Service Workers report them.
//!
//! [`stats`] builds the snapshot from the runtime in force (the policies and their stores)
//! and from the Prometheus text of `/metrics` ([`prom`]), so the dashboard and a scraper
//! always agree.
//!
//! It reads the runtime and the metrics text; it never changes a policy nor holds state of its
//! own between requests, and it imports no listener (the admin listener mounts it).

pub mod page;
pub mod prom;
pub mod stats;
