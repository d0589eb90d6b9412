//! `sluice stress URL`: load a server at a fixed rate and see what it answers.
//!
//! The [`plan`] (rate, duration, concurrency bound, method, headers) is checked first; [`run`](mod@run)
//! sends it open loop over pooled keep-alive HTTP/1.1 connections (hyper); [`summary`] counts
//! status codes and errors, and takes latency percentiles and the admitted (2xx) rate;
//! [`progress`] draws a live line when stdout is a terminal.
//!
//! ```no_run
//! # // Needs a server on 127.0.0.1:8080; see the crate's integration tests for a live run.
//! use clap::Parser;
//! let cli = sluice_server::cli::Cli::parse_from([
//!     "sluice", "stress", "http://127.0.0.1:8080/api/hello", "--rate", "50", "--duration", "2s",
//! ]);
//! ```

mod cmd;
pub mod plan;
pub mod progress;
pub mod run;
pub mod summary;

pub use cmd::{plan as check_args, run, Args, MAX_CONCURRENCY};
