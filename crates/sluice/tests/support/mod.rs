//! Test support: real redis-server processes, a proxy that loses answers and helper processes
//! for the store tests; small helpers for the tests on paused time.
#![allow(dead_code)]

#[cfg(feature = "redis")]
pub mod jobs;
pub mod model;
pub mod paused;
pub mod process;
#[cfg(feature = "redis")]
pub mod proxy;
pub mod redis;
