//! `sluice`: see `sluice --help` and the crate's README.

fn main() -> std::process::ExitCode {
    sluice_server::cli::run()
}
