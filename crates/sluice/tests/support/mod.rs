//! Test support shared by the store tests: real redis-server processes and helper processes.
#![allow(dead_code)]

pub mod process;
pub mod redis;
