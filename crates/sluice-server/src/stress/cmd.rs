//! The command line of `sluice stress`: arguments, the runtime, printing, exit status.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::Arc;

use http::{HeaderMap, Method};

use crate::stress::plan::{self, Plan, MAX_REQUESTS};
use crate::stress::progress;
use crate::stress::run::{self, Progress};
use crate::stress::summary::Summary;

/// The most requests in flight `--concurrency` may allow.
pub const MAX_CONCURRENCY: usize = 100_000;

const AFTER_HELP: &str = "\
Request i is sent at i / RATE from the start, whatever the earlier ones are doing (open loop).
When CONCURRENCY requests are in flight the next waits for one to finish; its latency still
counts from when it was due, and the summary reports such late starts.

Latency: from when a request was due to the end of its response body (nearest-rank
percentiles). Admitted rate: 2xx responses per second of DURATION.

Exit status: 0 done, 1 no connection could be made at all, 2 invalid arguments.

Only plain http:// is spoken. Send load only to servers you run or may test.";

/// The arguments of `sluice stress`.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// The URL to load, e.g. http://127.0.0.1:8080/api/hello.
    #[arg(value_name = "URL")]
    pub url: String,
    /// Requests per second (`50`, `2.5`), or a rate as in the config (`50/s`, `3000/min`).
    #[arg(long, short = 'r', value_name = "RATE", default_value = "10/s")]
    pub rate: String,
    /// How long to send for (`10s`, `500ms`, `1.5min`).
    #[arg(long, short = 'd', value_name = "DURATION", default_value = "10s")]
    pub duration: String,
    /// The most requests in flight at once.
    #[arg(long, short = 'c', value_name = "N", default_value_t = 100)]
    pub concurrency: usize,
    /// A request header, `Name: value` (repeatable), e.g. the key: "X-Api-Key: k1".
    #[arg(long = "header", short = 'H', value_name = "HEADER")]
    pub headers: Vec<String>,
    /// The request method.
    #[arg(long, short = 'X', value_name = "METHOD", default_value = "GET")]
    pub method: String,
    /// How long one request may take before it counts as a timeout.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub timeout: String,
    /// Print the summary as JSON (and no progress line).
    #[arg(long)]
    pub json: bool,
}

/// Checks the arguments.
///
/// # Errors
///
/// A message naming the flag and what was expected.
pub fn plan(args: &Args) -> Result<Plan, String> {
    let url = plan::parse_url(&args.url)?;
    let interval_ns = plan::parse_rate(&args.rate)?;
    let duration = plan::parse_positive_duration("--duration", &args.duration)?;
    let timeout = plan::parse_positive_duration("--timeout", &args.timeout)?;
    if !(1..=MAX_CONCURRENCY).contains(&args.concurrency) {
        return Err(format!(
            "--concurrency {}: must be between 1 and {MAX_CONCURRENCY}",
            args.concurrency
        ));
    }
    let method = Method::from_bytes(args.method.as_bytes())
        .map_err(|_| format!("--method `{}` is not an HTTP method", args.method))?;
    let mut headers = HeaderMap::new();
    for h in &args.headers {
        plan::add_header(&mut headers, h)?;
    }
    let plan = Plan {
        url,
        method,
        headers,
        interval_ns,
        duration,
        concurrency: args.concurrency,
        timeout,
    };
    if plan.requests() > MAX_REQUESTS {
        return Err(format!(
            "{} at {} makes {} requests; at most {MAX_REQUESTS}",
            args.duration,
            plan.rate_text(),
            plan.requests()
        ));
    }
    Ok(plan)
}

/// Runs `sluice stress`.
pub fn run(args: Args) -> ExitCode {
    let plan = match plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sluice stress: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice stress: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let show_progress = !args.json && std::io::stdout().is_terminal();
    let recorded = runtime.block_on(async {
        let live = Arc::new(Progress::default());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let bar = show_progress.then(|| {
            tokio::spawn(progress::draw(
                Arc::clone(&live),
                plan.requests(),
                plan.duration,
                stopped,
            ))
        });
        let recorded = run::run(&plan, live).await;
        let _ = stop.send(true);
        if let Some(bar) = bar {
            let _ = bar.await;
        }
        recorded
    });
    let summary = Summary::new(&plan, &recorded);
    if args.json {
        println!("{:#}", summary.json(&plan));
    } else {
        print!("{}", summary.text(&plan));
    }
    if summary.nothing_connected() {
        eprintln!("sluice stress: no connection to {} could be made", plan.url);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
