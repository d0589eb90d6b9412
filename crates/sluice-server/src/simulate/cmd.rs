//! The command line of `sluice simulate`: arguments, loading, printing, exit status.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ArgGroup;
use serde_json::json;
use sluice_core::queue::QueueConfig;
use sluice_core::{format_duration_ns, AnyAlgorithm};
use sluice_http::{key, KeySpec};

use crate::config::{self, Config, PolicyConfig};
use crate::simulate::engine::Engine;
use crate::simulate::pattern::Pattern;
use crate::simulate::report::Summary;
use crate::simulate::svg::{self, Labels};
use crate::simulate::trace;

const AFTER_HELP: &str = "\
Trace files (--trace FILE, or - for standard input): one request per line, `TIME [KEY [COST]]`.
  TIME  seconds from the start (0, 0.25, 12.5) or RFC 3339 (2024-05-01T12:00:00.250Z),
        counted from the first line; times must not go backwards
  KEY   the value the policy's key extracts (an IP, a header value); - for none
  COST  tokens, a whole number >= 1 (default 1)
  Blank lines and lines starting with # are skipped.

Patterns (--pattern):
  constant RATE for DURATION            evenly spaced: constant 5/s for 10s
  poisson RATE for DURATION             random gaps (--seed): poisson 4/s for 30s
  bursts N every DURATION for DURATION  N at once: bursts 20 every 5s for 60s
  idle DURATION                         nothing
  A + B runs A and B together; A then B runs B after A. After a shape, `keys N` spreads
  its requests over keys key-1..key-N in turn and `cost N` sets the tokens per request.

Exit status: 0 done, 1 the SVG could not be written, 2 invalid arguments, config, trace or
pattern.";

/// The arguments of `sluice simulate`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = AFTER_HELP,
    group(ArgGroup::new("load").required(true).args(["trace", "pattern"])),
)]
pub struct Args {
    /// The gateway configuration (default: the embedded defaults, see `sluice default-config`).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The policy to replay; may be left out when the configuration has only one.
    #[arg(long, short = 'p', value_name = "NAME")]
    pub policy: Option<String>,
    /// Replay the requests of a trace file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Replay a synthetic load, e.g. "poisson 4/s for 30s" (grammar below).
    #[arg(long, value_name = "PATTERN")]
    pub pattern: Option<String>,
    /// Also draw the bucket level and offered versus admitted requests into this SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// The seed of `poisson` gaps: the same seed, the same requests.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why `simulate` stopped: exit status and message.
struct Failure(u8, String);

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure(2, message.into())
    }
}

/// Runs `sluice simulate`.
pub fn run(args: Args) -> ExitCode {
    match simulate(&args) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(Failure(code, message)) => {
            eprintln!("{message}");
            ExitCode::from(code)
        }
    }
}

fn simulate(args: &Args) -> Result<String, Failure> {
    let config = match &args.config {
        Some(path) => config::load(path).map_err(|e| Failure::usage(e.to_string()))?,
        None => config::defaults(),
    };
    let policy = pick_policy(&config, args.policy.as_deref())?;
    let keyed = policy.key != KeySpec::Global;
    let (mut arrivals, horizon_ns, load) = match (&args.trace, &args.pattern) {
        (Some(path), _) => {
            let (text, shown) = read_trace(path)?;
            let arrivals = trace::parse(&text, &shown)
                .map_err(|e| Failure::usage(format!("sluice simulate: {e}")))?;
            let last = arrivals.last().map_or(0, |a| a.at_ns);
            (arrivals, last, format!("trace {shown}"))
        }
        (None, Some(text)) => {
            let pattern = Pattern::parse(text).map_err(|e| {
                let caret = format!("{:>width$}", "^", width = e.column);
                Failure::usage(format!(
                    "sluice simulate: --pattern: {e}\n  {text}\n  {caret}"
                ))
            })?;
            let arrivals = pattern
                .arrivals(args.seed)
                .map_err(|e| Failure::usage(format!("sluice simulate: --pattern: {e}")))?;
            let seed = if text.contains("poisson") {
                format!(" (seed {})", args.seed)
            } else {
                String::new()
            };
            (
                arrivals,
                pattern.duration_ns(),
                format!("pattern `{text}`{seed}"),
            )
        }
        (None, None) => {
            return Err(Failure::usage(
                "sluice simulate: give --trace FILE or --pattern TEXT",
            ))
        }
    };
    if keyed {
        // As the gateway: long or binary keys are hashed.
        for a in &mut arrivals {
            if let std::borrow::Cow::Owned(k) = key::normalize(a.key.as_bytes()) {
                a.key = k;
            }
        }
    }
    let algorithm = AnyAlgorithm::new(policy.algorithm, policy.quota);
    let queue = match policy.queue {
        Some(q) if q.depth > 0 => QueueConfig {
            depth: q.depth,
            max_wait_ns: u64::try_from(q.max_wait.as_nanos()).unwrap_or(u64::MAX),
        },
        _ => QueueConfig::NONE,
    };
    let run = Engine::new(algorithm, queue, keyed).run(&arrivals, horizon_ns);
    let summary = Summary::new(&run, &arrivals, horizon_ns);
    let title = describe(policy);
    let mut notes = Vec::new();
    if let Some(n) = policy.concurrency {
        notes.push(format!(
            "note: concurrency = {n} is not simulated (it depends on how long the upstream takes)"
        ));
    }
    if keyed && run.keys.len() > policy.max_keys {
        notes.push(format!(
            "note: {} keys exceed max_keys = {}: the gateway would evict idle keys, the simulation keeps them all",
            run.keys.len(),
            policy.max_keys
        ));
    }
    if let Some(path) = &args.svg {
        let picture = svg::render(
            &run,
            &arrivals,
            summary.span_ns,
            Labels {
                title: &title,
                subtitle: &format!(
                    "{load}: {} offered, {} admitted, {} denied",
                    summary.offered,
                    summary.admitted,
                    summary.denied_total()
                ),
                capacity: policy.quota.capacity(),
            },
        );
        std::fs::write(path, picture).map_err(|e| {
            Failure(
                1,
                format!("sluice simulate: cannot write {}: {e}", path.display()),
            )
        })?;
    }
    if args.json {
        let queue = policy
            .queue
            .filter(|q| q.depth > 0)
            .map(|q| json!({ "depth": q.depth, "max_wait_ms": q.max_wait.as_secs_f64() * 1e3 }));
        let policy_json = json!({
            "name": policy.name,
            "algorithm": policy.algorithm.name(),
            "capacity": policy.quota.capacity(),
            "rate": policy.quota.rate().to_string(),
            "key": policy.key.to_string(),
            "queue": queue,
        });
        let mut value = summary.json(policy_json, json!(load));
        value["notes"] = json!(notes);
        return Ok(format!("{value:#}\n"));
    }
    let mut out = summary.text(&format!("{title} (from {})", config.source), &load, keyed);
    for note in notes {
        out.push('\n');
        out.push_str(&note);
        out.push('\n');
    }
    if let Some(path) = &args.svg {
        out.push_str(&format!("\nwrote {}\n", path.display()));
    }
    Ok(out)
}

fn pick_policy<'a>(config: &'a Config, name: Option<&str>) -> Result<&'a PolicyConfig, Failure> {
    let names = || {
        config
            .policies
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => config
            .policies
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                Failure::usage(format!(
                    "sluice simulate: no policy `{name}` in {}; defined: {}",
                    config.source,
                    if config.policies.is_empty() {
                        "none".to_owned()
                    } else {
                        names()
                    }
                ))
            }),
        None => match config.policies.as_slice() {
            [only] => Ok(only),
            [] => Err(Failure::usage(format!(
                "sluice simulate: {} defines no policy",
                config.source
            ))),
            _ => Err(Failure::usage(format!(
                "sluice simulate: {} defines several policies; choose one with --policy: {}",
                config.source,
                names()
            ))),
        },
    }
}

fn read_trace(path: &Path) -> Result<(String, String), Failure> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| {
            Failure::usage(format!("sluice simulate: cannot read standard input: {e}"))
        })?;
        return Ok((text, "<stdin>".to_owned()));
    }
    let shown = path.display().to_string();
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::usage(format!("sluice simulate: cannot read {shown}: {e}")))?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok((text, shown)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
            Err(Failure::usage(format!(
                "sluice simulate: {shown}:{line}: the trace is not valid UTF-8"
            )))
        }
    }
}

/// `policy `api`: token_bucket, capacity 10 at 5/s, key ip, queue 20 waiting at most 2s`.
fn describe(p: &PolicyConfig) -> String {
    let queue = match p.queue {
        Some(q) if q.depth > 0 => format!(
            "queue {} waiting at most {}",
            q.depth,
            format_duration_ns(u64::try_from(q.max_wait.as_nanos()).unwrap_or(u64::MAX))
        ),
        _ => "no queue".to_owned(),
    };
    format!(
        "policy `{}`: {}, capacity {} at {}, key {}, {queue}",
        p.name,
        p.algorithm,
        p.quota.capacity(),
        p.quota.rate(),
        p.key
    )
}
