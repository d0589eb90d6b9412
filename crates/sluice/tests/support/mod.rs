//! Test support shared by the store tests: real redis-server processes, a proxy that loses
//! answers, and helper processes.
#![allow(dead_code)]

pub mod process;
#[cfg(feature = "redis")]
pub mod proxy;
pub mod redis;
