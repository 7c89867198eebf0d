//! The results of `bench operator` (a [`Row`] per N and `--max-concurrent-reconciles`, a
//! [`Pair`] per raw-write bound and catch-up, [`Requests`] by verb) and the Markdown table
//! they are printed as.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::BenchArgs;
use super::latency::Latency;
use crate::measure::{median, mib, secs, spread};

/// API requests by verb (in-memory server only).
#[derive(Clone, Debug, Default)]
pub(super) struct Requests {
    pub(super) by_verb: BTreeMap<String, u64>,
    pub(super) writes: u64,
}

impl Requests {
    pub(super) fn of(counts: &apisim::RequestCounts) -> Self {
        Self {
            by_verb: counts.by_verb(),
            writes: counts.writes(),
        }
    }

    pub(super) fn show(&self) -> String {
        if self.by_verb.is_empty() {
            return "none".into();
        }
        self.by_verb
            .iter()
            .map(|(v, c)| format!("{v} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Everything measured for one N and one `--max-concurrent-reconciles`.
#[derive(Clone, Debug, Default)]
pub(super) struct Row {
    pub(super) n: usize,
    pub(super) reconciles: u16,
    /// The raw-write bound and the catch-up, measured `--pairs` times.
    pub(super) pairs: Vec<Pair>,
    pub(super) create_crs: Duration,
    pub(super) children_and_status: Duration,
    pub(super) pods_ready: Duration,
    pub(super) steady: Option<Requests>,
    /// Requests from the start of the creation until children + status (every client).
    pub(super) converging: Option<Requests>,
    pub(super) steady_cpu: Duration,
    /// CPU time while converging: the operator, and this process (the in-memory API server,
    /// its simulator and the bench's clients).
    pub(super) converging_cpu: (Duration, Duration),
    pub(super) latency_idle: Latency,
    pub(super) latency_load: Latency,
    pub(super) rss_idle: u64,
    pub(super) rss_converged: u64,
    pub(super) rss_pods: u64,
    pub(super) rss_peak: u64,
    /// The operator's connections to the API server, idle and converged.
    pub(super) connections_idle: usize,
    pub(super) connections_converged: usize,
    pub(super) wall: Duration,
}

/// One raw-write bound and one catch-up, measured back to back.
#[derive(Clone, Debug, Default)]
pub(super) struct Pair {
    /// None with `--skip-bound`.
    pub(super) bound: Option<Duration>,
    /// CPU time of this process (API server, simulator, client) during the bound.
    pub(super) bound_cpu: Duration,
    /// The N Memcacheds created before the operator starts: from its start to children +
    /// status for all (start-up and cache sync included).
    pub(super) catch_up: Duration,
    /// Of `catch_up`, from starting the process to its first child written.
    pub(super) startup: Option<Duration>,
    /// Every request during the catch-up (in-memory server only).
    pub(super) requests: Option<Requests>,
    /// CPU time during the catch-up: the operator, and this process.
    pub(super) cpu: (Duration, Duration),
}

impl Pair {
    pub(super) fn ratio(&self) -> Option<f64> {
        let bound = self.bound?.as_secs_f64();
        (bound > 0.0).then(|| self.catch_up.as_secs_f64() / bound)
    }
}

pub(super) fn ratio(a: Duration, b: Option<Duration>) -> String {
    match b {
        Some(b) if !b.is_zero() => format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64()),
        _ => "–".into(),
    }
}

pub(super) fn median_duration(values: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    median(values.into_iter().map(|d| d.as_secs_f64()).collect()).map(Duration::from_secs_f64)
}

impl Row {
    pub(super) fn bounds(&self) -> Vec<Duration> {
        self.pairs.iter().filter_map(|p| p.bound).collect()
    }

    /// The pair whose catch-up is the median one (the lower middle for an even count).
    pub(super) fn median_pair(&self) -> Option<&Pair> {
        let mut pairs: Vec<&Pair> = self.pairs.iter().collect();
        pairs.sort_by_key(|p| p.catch_up);
        pairs.get(pairs.len().saturating_sub(1) / 2).copied()
    }
}

/// The results as one Markdown table, a column per run.
pub(super) fn table(args: &BenchArgs, rows: &[Row]) -> String {
    let mut out = String::new();
    let header: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut about = Vec::new();
            if args.max_concurrent_reconciles.len() > 1 {
                about.push(format!("reconciles {}", r.reconciles));
            }
            if args.namespaces > 1 {
                about.push(format!("{} namespaces", args.namespaces));
            }
            if args.cluster_wide {
                about.push("operator watching all namespaces".to_string());
            }
            if about.is_empty() {
                format!("N={}", r.n)
            } else {
                format!("N={} ({})", r.n, about.join(", "))
            }
        })
        .collect();
    let _ = writeln!(out, "| | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(rows.len()));
    // On a real cluster the API server is another process: the CPU beside the operator's
    // is the bench's own client, and requests are the operator's, read from the audit log.
    let real = args.kubeconfig.is_some();
    let others = if real {
        "bench client"
    } else {
        "API server + simulator + clients"
    };
    let whose = if real {
        "the operator's (audit log)"
    } else {
        "all clients"
    };
    let mut line = |label: &str, cell: &dyn Fn(&Row) -> String| {
        let cells: Vec<String> = rows.iter().map(cell).collect();
        let _ = writeln!(out, "| {label} | {} |", cells.join(" | "));
    };
    line(
        &format!(
            "raw-write bound (creates of Deployment, 2 Services, PDB + status patch; {} in flight)",
            args.concurrency
        ),
        &|r| spread(r.bounds().iter().map(Duration::as_secs_f64).collect(), " s"),
    );
    line(
        &format!(
            "  CPU: {}",
            if real {
                "bench client"
            } else {
                "API server + simulator + client"
            }
        ),
        &|r| {
            let cpu = r
                .pairs
                .iter()
                .filter(|p| p.bound.is_some())
                .map(|p| p.bound_cpu);
            median_duration(cpu).map(secs).unwrap_or_else(|| "–".into())
        },
    );
    line("creating the N Memcacheds (client)", &|r| {
        secs(r.create_crs)
    });
    line("convergence: children + status", &|r| {
        secs(r.children_and_status)
    });
    line("  ratio to the bound (median)", &|r| {
        ratio(r.children_and_status, median_duration(r.bounds()))
    });
    line(&format!("requests until then, {whose} (writes)"), &|r| {
        r.converging
            .as_ref()
            .map(|s| format!("{} ({})", s.show(), s.writes))
            .unwrap_or_else(|| "n/a".into())
    });
    line(
        &format!("CPU while converging: operator / {others}"),
        &|r| {
            format!(
                "{} / {}",
                secs(r.converging_cpu.0),
                secs(r.converging_cpu.1)
            )
        },
    );
    line(
        "catch-up: CRs created first, operator started → children + status",
        &|r| {
            spread(
                r.pairs.iter().map(|p| p.catch_up.as_secs_f64()).collect(),
                " s",
            )
        },
    );
    line("  ratio to the bound (median of the paired ratios)", &|r| {
        spread(r.pairs.iter().filter_map(Pair::ratio).collect(), "×")
    });
    line(
        "  of which start-up (process start → first child written)",
        &|r| {
            median_duration(r.pairs.iter().filter_map(|p| p.startup))
                .map(secs)
                .unwrap_or_else(|| "–".into())
        },
    );
    line(
        &format!("  requests (writes), the median catch-up's, {whose}"),
        &|r| {
            r.median_pair()
                .and_then(|p| p.requests.as_ref())
                .map(|s| format!("{} ({})", s.show(), s.writes))
                .unwrap_or_else(|| "n/a".into())
        },
    );
    line(&format!("  CPU: operator / {others} (medians)"), &|r| {
        let operator = median_duration(r.pairs.iter().map(|p| p.cpu.0));
        let rest = median_duration(r.pairs.iter().map(|p| p.cpu.1));
        match (operator, rest) {
            (Some(operator), Some(rest)) => format!("{} / {}", secs(operator), secs(rest)),
            _ => "–".into(),
        }
    });
    line("convergence: all pods ready in status", &|r| {
        secs(r.pods_ready)
    });
    line(
        &format!(
            "steady state: writes in {} (resync {})",
            secs(args.steady_window),
            secs(args.resync_period)
        ),
        &|r| {
            r.steady
                .as_ref()
                .map(|s| s.writes.to_string())
                .unwrap_or_else(|| "n/a".into())
        },
    );
    line(&format!("steady state: requests by verb, {whose}"), &|r| {
        r.steady
            .as_ref()
            .map(Requests::show)
            .unwrap_or_else(|| "n/a".into())
    });
    line("steady state: operator CPU in the window", &|r| {
        secs(r.steady_cpu)
    });
    line("event→reconcile p50 / p99, idle", &|r| {
        r.latency_idle.show()
    });
    line(
        "event→reconcile p50 / p99, under the N-object load",
        &|r| r.latency_load.show(),
    );
    line("operator RSS idle (caches synced, no CRs)", &|r| {
        mib(r.rss_idle)
    });
    line("operator RSS, N converged", &|r| mib(r.rss_converged));
    line("operator RSS, N converged + 3N pods cached", &|r| {
        mib(r.rss_pods)
    });
    line("operator peak RSS (VmHWM)", &|r| mib(r.rss_peak));
    line(
        "operator's connections to the API server, idle / converged",
        &|r| format!("{} / {}", r.connections_idle, r.connections_converged),
    );
    line("wall time of this column", &|r| secs(r.wall));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> std::result::Result<BenchArgs, String> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        <Cli as clap::Parser>::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
            .map(|c| c.bench)
            .map_err(|e| e.to_string())
    }

    /// The header says over how many namespaces the pools were spread, when more than one
    /// (the default, one, leaves the table as it was).
    #[test]
    fn the_header_names_the_namespaces() {
        let rows = [Row {
            n: 60,
            reconciles: 16,
            ..Row::default()
        }];
        let header = |flags: &[&str]| {
            let args = args(flags).unwrap();
            table(&args, &rows)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(header(&[]), "| | N=60 |");
        assert_eq!(header(&["--namespaces", "1"]), "| | N=60 |");
        assert_eq!(header(&["--namespaces", "3"]), "| | N=60 (3 namespaces) |");
        assert_eq!(
            header(&["--namespaces", "3", "--max-concurrent-reconciles", "8,16"]),
            "| | N=60 (reconciles 16, 3 namespaces) |"
        );
        assert!(args(&["--namespaces", "0"]).is_err());
        assert_eq!(
            header(&["--namespaces", "3", "--kubeconfig", "k", "--cluster-wide"]),
            "| | N=60 (3 namespaces, operator watching all namespaces) |"
        );
        assert!(args(&["--cluster-wide"]).is_err(), "only on a cluster");
    }

    #[test]
    fn the_ratio_is_the_median_of_the_paired_ratios() {
        let pair = |bound: u64, catch_up: u64| Pair {
            bound: Some(Duration::from_millis(bound)),
            catch_up: Duration::from_millis(catch_up),
            ..Pair::default()
        };
        // One pair in a slow spell (a fast bound, a slow catch-up) does not decide the result;
        // the median catch-up over the median bound would say 1.95 / 1.3 = 1.5×.
        let row = Row {
            pairs: vec![
                pair(1000, 1100),
                pair(2000, 2400),
                pair(1600, 1900),
                pair(1000, 2000),
            ],
            ..Row::default()
        };
        let ratios: Vec<f64> = row.pairs.iter().filter_map(Pair::ratio).collect();
        let mid = median(ratios.clone()).unwrap_or_default();
        assert!((mid - (1.1875 + 1.2) / 2.0).abs() < 1e-9, "{mid}");
        assert_eq!(spread(ratios, "×"), "1.19× (1.10–2.00×, 4 runs)");
        assert_eq!(
            row.median_pair().map(|p| p.catch_up.as_millis()),
            Some(1900)
        );
        assert_eq!(spread(vec![1.5], " s"), "1.50 s");
        assert_eq!(spread(Vec::new(), " s"), "–");
        let skipped = Pair {
            bound: None,
            ..pair(0, 1000)
        };
        assert_eq!(skipped.ratio(), None);
    }
}
