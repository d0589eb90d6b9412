//! `--svg`: the bucket level over time, and offered versus admitted requests, as a
//! hand-written SVG (no dependencies, opens in any browser).

use std::fmt::Write as _;

use crate::simulate::arrival::{secs, Arrival};
use crate::simulate::engine::{Fate, Run};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 590.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 24.0;
/// The level panel, then the counts panel: (top, bottom).
const LEVEL: (f64, f64) = (78.0, 268.0);
const COUNTS: (f64, f64) = (330.0, 500.0);

const BLUE: &str = "#2563eb";
const GREEN: &str = "#16a34a";
const GREY: &str = "#cbd5e1";
const INK: &str = "#1f2937";
const FAINT: &str = "#e5e7eb";

/// What the picture is of.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    /// First line: the policy.
    pub title: &'a str,
    /// Second line: the load.
    pub subtitle: &'a str,
    /// The bucket's capacity (top of the level axis).
    pub capacity: u64,
}

/// Draws `run` of `arrivals` over `span_ns`.
pub fn render(run: &Run, arrivals: &[Arrival], span_ns: u64, labels: Labels<'_>) -> String {
    let span = secs(span_ns.max(1));
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |t_ns: u64| LEFT + plot_w * (secs(t_ns) / span).min(1.0);
    let mut s = String::with_capacity(64 * 1024);
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{LEFT}" y="26" font-size="15" font-weight="600" fill="{INK}">{}</text>
<text x="{LEFT}" y="46" fill="#4b5563">{}</text>
"##,
        escape(labels.title),
        escape(labels.subtitle)
    );

    // === the bucket level ===
    let cap = labels.capacity.max(1) as f64;
    let (top, bottom) = LEVEL;
    let y = |tokens: f64| bottom - (bottom - top) * (tokens / cap).clamp(0.0, 1.0);
    let key = &run.keys.get(run.plotted).map_or("", String::as_str);
    let which = if run.keys.len() > 1 {
        format!(
            " — key `{}` (the busiest of {})",
            escape(key),
            run.keys.len()
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{}" font-weight="600" fill="{INK}">Tokens in the bucket{which}</text>"##,
        top - 10.0
    );
    y_axis(&mut s, (top, bottom), cap, y);
    time_axis(&mut s, bottom, span, &x);
    if !run.levels.is_empty() {
        let mut line = String::new();
        for (i, l) in run.levels.iter().enumerate() {
            let _ = write!(
                line,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                x(l.at_ns),
                y(l.tokens)
            );
        }
        let first = x(run.levels[0].at_ns);
        let last = x(run.levels[run.levels.len() - 1].at_ns);
        let _ = writeln!(
            s,
            r##"<path d="{line} L{last:.1},{bottom:.1} L{first:.1},{bottom:.1} Z" fill="{BLUE}" fill-opacity="0.12" stroke="none"/>
<path d="{line}" fill="none" stroke="{BLUE}" stroke-width="1.5" stroke-linejoin="round"/>"##
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{top}" y2="{top}" stroke="{BLUE}" stroke-dasharray="4 4" stroke-opacity="0.6"/>
<text x="{:.1}" y="{}" text-anchor="end" fill="{BLUE}">capacity {}</text>"##,
        WIDTH - RIGHT,
        WIDTH - RIGHT,
        top - 4.0,
        labels.capacity
    );

    // === offered versus admitted ===
    let (top, bottom) = COUNTS;
    let bin_ns = bin_width(span_ns.max(1));
    let bins = span_ns.div_ceil(bin_ns).max(1) as usize;
    let mut offered = vec![0u64; bins];
    let mut admitted = vec![0u64; bins];
    for (a, f) in arrivals.iter().zip(&run.fates) {
        offered[((a.at_ns / bin_ns) as usize).min(bins - 1)] += 1;
        if let Fate::Admitted { at_ns, .. } = f {
            admitted[((at_ns / bin_ns) as usize).min(bins - 1)] += 1;
        }
    }
    let most = offered
        .iter()
        .chain(&admitted)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y = |n: f64| bottom - (bottom - top) * (n / most);
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{}" font-weight="600" fill="{INK}">Requests per {}: offered and admitted</text>"##,
        top - 10.0,
        describe(bin_ns)
    );
    y_axis(&mut s, (top, bottom), most, y);
    let slot = plot_w * (bin_ns as f64 / 1e9) / span;
    for i in 0..bins {
        let x0 = LEFT + slot * i as f64;
        let (o, a) = (offered[i] as f64, admitted[i] as f64);
        let w = (slot * 0.8).max(0.5);
        if o > 0.0 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.2}" y="{:.2}" width="{w:.2}" height="{:.2}" fill="{GREY}"/>"##,
                x0 + slot * 0.1,
                y(o),
                bottom - y(o)
            );
        }
        if a > 0.0 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{GREEN}"/>"##,
                x0 + slot * 0.25,
                y(a),
                (slot * 0.5).max(0.5),
                bottom - y(a)
            );
        }
    }
    time_axis(&mut s, bottom, span, &x);
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#4b5563">time (s)</text>"##,
        LEFT + plot_w / 2.0,
        bottom + 36.0
    );
    // Legend.
    let ly = HEIGHT - 20.0;
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{}" width="14" height="10" fill="{GREY}"/><text x="{}" y="{ly}" fill="{INK}">offered</text>
<rect x="{}" y="{}" width="14" height="10" fill="{GREEN}"/><text x="{}" y="{ly}" fill="{INK}">admitted (when admitted, after any wait)</text>
<rect x="{}" y="{}" width="14" height="4" fill="{BLUE}"/><text x="{}" y="{ly}" fill="{INK}">tokens available</text>"##,
        ly - 9.0,
        LEFT + 20.0,
        LEFT + 90.0,
        ly - 9.0,
        LEFT + 110.0,
        LEFT + 380.0,
        ly - 6.0,
        LEFT + 400.0,
    );
    s.push_str("</svg>\n");
    s
}

/// Horizontal grid lines and labels for 0..=max.
fn y_axis(s: &mut String, (top, bottom): (f64, f64), max: f64, y: impl Fn(f64) -> f64) {
    let step = nice_step(max, 4);
    let mut v = 0.0;
    while v <= max + 1e-9 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{FAINT}"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#4b5563">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 8.0,
            yy + 4.0,
            number(v)
        );
        v += step;
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{top}" y2="{bottom}" stroke="#9ca3af"/>"##
    );
}

/// The time axis under a panel.
fn time_axis(s: &mut String, bottom: f64, span: f64, x: &impl Fn(u64) -> f64) {
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{bottom}" y2="{bottom}" stroke="#9ca3af"/>"##,
        WIDTH - RIGHT
    );
    let step = nice_step(span, 8);
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let xx = x((t * 1e9).round() as u64);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{bottom}" y2="{:.1}" stroke="#9ca3af"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#4b5563">{}</text>"##,
            bottom + 5.0,
            bottom + 18.0,
            number(t)
        );
        t += step;
    }
}

/// A step of 1, 2 or 5 × 10^k giving at most about `ticks` steps up to `max`.
fn nice_step(max: f64, ticks: u32) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / f64::from(ticks);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    step.max(1e-9)
}

fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A bin width of 1, 2 or 5 × 10^k ms giving at most 150 bins over `span_ns`.
fn bin_width(span_ns: u64) -> u64 {
    let mut decade = 1_000_000u64;
    loop {
        for m in [1, 2, 5] {
            let width = m * decade;
            if span_ns / width <= 150 {
                return width;
            }
        }
        decade = decade.saturating_mul(10);
    }
}

/// `bin_ns` for a label: `1 s`, `200 ms`.
fn describe(bin_ns: u64) -> String {
    if bin_ns >= 1_000_000_000 && bin_ns.is_multiple_of(1_000_000_000) {
        format!("{} s", bin_ns / 1_000_000_000)
    } else {
        format!("{} ms", number(bin_ns as f64 / 1e6))
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_and_steps() {
        assert_eq!(bin_width(8_000_000_000), 100_000_000);
        assert_eq!(bin_width(60_000_000_000), 500_000_000);
        assert_eq!(bin_width(100_000_000), 1_000_000);
        assert_eq!(bin_width(3_600_000_000_000), 50_000_000_000);
        assert_eq!(nice_step(8.0, 8), 1.0);
        assert_eq!(nice_step(60.0, 8), 10.0);
        assert_eq!(nice_step(2.0, 4), 0.5);
        assert_eq!(describe(1_000_000_000), "1 s");
        assert_eq!(describe(200_000_000), "200 ms");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
