//! The side-by-side table for one N: a column per contender, medians and ranges over runs,
//! ratios taken within a run.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Contender, Measured};
use crate::measure::{median, mib, ms, spread};

pub(super) fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Median and range of counts: `7955 (7947–8091)`.
pub(super) fn count_cell(v: Vec<u64>) -> String {
    let mid = median(v.iter().map(|&w| w as f64).collect()).unwrap_or(0.0);
    format!(
        "{mid:.0} ({}–{})",
        v.iter().min().unwrap_or(&0),
        v.iter().max().unwrap_or(&0)
    )
}

/// The run whose time to done is the median (the later of the middle two for an even count).
fn median_run(runs: &[Measured]) -> Option<&Measured> {
    let mut all: Vec<&Measured> = runs.iter().collect();
    all.sort_by_key(|m| m.converged);
    all.get(all.len() / 2).copied()
}

/// The side-by-side table for one N; ratios are taken within a run (contender over its own
/// bound, ours over the peers).
pub(super) fn table(
    n: usize,
    contenders: &[Contender],
    results: &BTreeMap<Contender, Vec<Measured>>,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### N = {n} (size 3 each; medians, range over runs)\n"
    );
    let _ = writeln!(
        out,
        "| | {} |",
        contenders
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(out, "|---|{}", "---|".repeat(contenders.len()));
    let row = |label: &str, f: &dyn Fn(Contender, &[Measured]) -> String| {
        let cells: Vec<String> = contenders
            .iter()
            .map(|&c| {
                results
                    .get(&c)
                    .map(|m| f(c, m))
                    .unwrap_or_else(|| "–".into())
            })
            .collect();
        // A row with nothing to show for these contenders (the peers' rows without a
        // peer, the bounds' rows on a bare control plane) is left out.
        if cells.iter().all(|c| c == "–") {
            return String::new();
        }
        format!("| {label} | {} |\n", cells.join(" | "))
    };
    // Time over `bound`, per run, of the contenders that run as processes.
    let over = |bound: Contender| {
        move |c: Contender, m: &[Measured]| match results.get(&bound) {
            Some(b) if c.user_agent().is_some() => spread(
                m.iter()
                    .zip(b)
                    .map(|(m, b)| m.converged.as_secs_f64() / b.converged.as_secs_f64().max(1e-9))
                    .collect(),
                "×",
            ),
            _ => "–".into(),
        }
    };
    out.push_str(&row("every Memcached done", &|_, m| {
        spread(m.iter().map(|m| m.converged.as_secs_f64()).collect(), " s")
    }));
    out.push_str(&row("over its own bound (per run)", &|c, m| match c
        .bound()
        .and_then(|b| results.get(&b))
    {
        Some(b) => spread(
            m.iter()
                .zip(b)
                .map(|(m, b)| m.converged.as_secs_f64() / b.converged.as_secs_f64().max(1e-9))
                .collect(),
            "×",
        ),
        None => "–".into(),
    }));
    for bound in [Contender::MinimalCreates, Contender::SsaBound] {
        out.push_str(&row(
            &format!("over {} (per run)", bound.name()),
            &over(bound),
        ));
    }
    out.push_str(&row(
        "peer's time over ours (per run)",
        &|c, m| match results.get(&Contender::Ours) {
            // The bare bounds have rows of their own, ours over each.
            Some(ours) if c != Contender::Ours && c.runs_with_pods() => spread(
                m.iter()
                    .zip(ours)
                    .map(|(m, o)| m.converged.as_secs_f64() / o.converged.as_secs_f64().max(1e-9))
                    .collect(),
                "×",
            ),
            _ => "–".into(),
        },
    ));
    out.push_str(&row("writes", &|_, m| {
        count_cell(m.iter().map(|m| m.writes).collect())
    }));
    out.push_str(&row("writes by all clients until done", &|_, m| {
        count_cell(m.iter().map(|m| m.cluster_writes).collect())
    }));
    out.push_str(&row(
        "control-plane CPU until done (median run)",
        &|_, m| match median_run(m) {
            Some(m) if !m.cluster_cpu.is_empty() => {
                let total: f64 = m.cluster_cpu.values().map(Duration::as_secs_f64).sum();
                let parts: Vec<String> = m
                    .cluster_cpu
                    .iter()
                    .map(|(name, cpu)| format!("{name} {:.1}", cpu.as_secs_f64()))
                    .collect();
                format!("{total:.1} s: {}", parts.join(", "))
            }
            _ => "–".into(),
        },
    ));
    out.push_str(&row(
        "writes by all clients, by writer and resource (median run; the 12 most)",
        &|_, m| match median_run(m) {
            Some(m) if !m.cluster_writes_by.is_empty() => {
                let mut by: Vec<(&String, &u64)> = m.cluster_writes_by.iter().collect();
                by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                by.iter()
                    .take(12)
                    .map(|(w, c)| format!("{w} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
            _ => "–".into(),
        },
    ));
    out.push_str(&row(
        "requests by verb (median run)",
        &|_, m| match median_run(m) {
            Some(m) if !m.requests.is_empty() => m
                .requests
                .iter()
                .map(|(v, c)| format!("{v} {c}"))
                .collect::<Vec<_>>()
                .join(", "),
            _ => "–".into(),
        },
    ));
    out.push_str(&row("CPU until done", &|_, m| {
        let v: Vec<f64> = m
            .iter()
            .filter_map(|m| m.cpu)
            .map(|d| d.as_secs_f64())
            .collect();
        if v.is_empty() {
            "–".into()
        } else {
            spread(v, " s")
        }
    }));
    out.push_str(&row("peak RSS", &|_, m| {
        let v: Vec<u64> = m.iter().filter_map(|m| m.peak_rss_kib).collect();
        match median(v.iter().map(|&k| k as f64).collect()) {
            Some(mid) => format!(
                "{} ({}–{})",
                mib(mid as u64),
                mib(v.iter().copied().min().unwrap_or(0)),
                mib(v.iter().copied().max().unwrap_or(0))
            ),
            None => "–".into(),
        }
    }));
    out.push_str(&row("requests / writes per resync", &|_, m| {
        let v: Vec<(u64, u64)> = m.iter().filter_map(|m| m.steady).collect();
        if v.is_empty() {
            return "–".into();
        }
        format!(
            "{} / {}",
            median(v.iter().map(|s| s.0 as f64).collect()).unwrap_or(0.0),
            median(v.iter().map(|s| s.1 as f64).collect()).unwrap_or(0.0)
        )
    }));
    let lat = |samples: Vec<Duration>| -> String {
        match (percentile(&samples, 50.0), percentile(&samples, 99.0)) {
            (Some(p50), Some(p99)) => format!("{} / {} (n={})", ms(p50), ms(p99), samples.len()),
            _ => "–".into(),
        }
    };
    out.push_str(&row("scale latency p50 / p99, under load", &|_, m| {
        lat(m.iter().flat_map(|m| m.latency_load.clone()).collect())
    }));
    out.push_str(&row("scale latency p50 / p99, idle", &|_, m| {
        lat(m.iter().flat_map(|m| m.latency_idle.clone()).collect())
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(secs: &[f64]) -> Vec<Measured> {
        secs.iter()
            .map(|&s| Measured {
                converged: Duration::from_secs_f64(s),
                ..Measured::default()
            })
            .collect()
    }

    /// On a bare control plane ours is given over each bound, run by run; rows with nothing
    /// to show for these contenders (the peers', the raw-write bound's) are left out.
    #[test]
    fn bare_table_gives_ours_over_each_bound_per_run() {
        use Contender::*;
        let contenders = [MinimalCreates, SsaBound, Ours];
        let results = BTreeMap::from([
            (MinimalCreates, runs(&[1.0, 2.0])),
            (SsaBound, runs(&[2.0, 2.0])),
            (Ours, runs(&[3.0, 5.0])),
        ]);
        let out = table(50, &contenders, &results);
        let line = |label: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("| {label} |")))
                .map(str::to_string)
        };
        assert_eq!(
            line("over minimal creates (per run)").as_deref(),
            Some("| over minimal creates (per run) | – | – | 2.75× (2.50–3.00×, 2 runs) |")
        );
        assert_eq!(
            line("over SSA bound (ours' children) (per run)").as_deref(),
            Some(
                "| over SSA bound (ours' children) (per run) | – | – | 2.00× (1.50–2.50×, 2 runs) |"
            )
        );
        assert!(line("over its own bound (per run)").is_none(), "{out}");
        assert!(line("peer's time over ours (per run)").is_none(), "{out}");
        assert!(line("every Memcached done").is_some());
    }
}
