//! Benchmarks live in `benches/benches/`; this library is empty on purpose.
