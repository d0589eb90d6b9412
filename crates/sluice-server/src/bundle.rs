//! `sluice bundle`: the browser limiter as static files for any web app, from the `[browser]`
//! table of a configuration file (or the embedded defaults).
//!
//! | file | what |
//! |---|---|
//! | `sluice-sw.js` | the Service Worker, as the gateway serves `/sluice/sw.js` (the module embedded) |
//! | `sluice-sw-import.js` | the import form, for `importScripts()` in an app's own worker |
//! | `sluice-sw.mjs` | the ES module form, for an app's own `{type: 'module'}` worker |
//! | `sluice-client.js` | `register()` and `politeFetch()` (`web/client.js`) |
//! | `sluice-config.json` | the worker's configuration, as `/sluice/config.json` |
//!
//! Exit status: 0 written, 1 the directory or a file could not be written, 2 an invalid
//! configuration (every error as `FILE:LINE:COLUMN: FIELD: MESSAGE`, as `check-config`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::browser::assets;
use crate::config::{self, Routes};

/// `sluice bundle`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The TOML configuration file whose `[browser]` table to bundle (it may have no
    /// `[[route]]`). Without it: the embedded defaults (see `sluice default-config`).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The directory to write the files to (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: PathBuf,
}

/// The files of one bundle: name and contents, for the worker configuration `config_json`.
///
/// # Examples
///
/// ```
/// let files = sluice_server::bundle::files(r#"{"capacity":3}"#);
/// let names: Vec<&str> = files.iter().map(|(name, _)| *name).collect();
/// assert_eq!(
///     names,
///     ["sluice-sw.js", "sluice-sw-import.js", "sluice-sw.mjs", "sluice-client.js", "sluice-config.json"]
/// );
/// ```
pub fn files(config_json: &str) -> Vec<(&'static str, String)> {
    vec![
        ("sluice-sw.js", assets::service_worker(config_json)),
        (
            "sluice-sw-import.js",
            assets::service_worker_import(config_json),
        ),
        ("sluice-sw.mjs", assets::service_worker_module(config_json)),
        ("sluice-client.js", assets::CLIENT_JS.to_owned()),
        ("sluice-config.json", format!("{config_json}\n")),
    ]
}

/// Runs `sluice bundle`.
pub fn run(args: Args) -> ExitCode {
    let (source, loaded) = match &args.config {
        Some(path) => (
            path.display().to_string(),
            config::load_as(path, Routes::Optional),
        ),
        None => (config::DEFAULT_SOURCE.to_owned(), Ok(config::defaults())),
    };
    let browser = match loaded {
        Ok(c) => c.browser,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(browser) = browser else {
        eprintln!(
            "{source}: browser: no [browser] table, nothing to bundle (an empty `[browser]` takes the defaults)"
        );
        return ExitCode::from(2);
    };
    let json = browser.worker_json().to_string();
    match write(&args.out, &files(&json)) {
        Ok(written) => {
            for (path, len) in written {
                println!("{} ({len} bytes)", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice bundle: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write(dir: &Path, files: &[(&str, String)]) -> Result<Vec<(PathBuf, usize)>, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push((path, text.len()));
    }
    Ok(written)
}
