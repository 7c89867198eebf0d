//! The event→reconcile latency: spec changes of the `latency` Memcached (size 3 ↔ 4, in
//! the phase's first namespace) timed until its Deployment follows, and their percentiles.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::env::Env;
use super::{LATENCY_CR, SIZE};
use crate::Result;
use crate::measure::ms;

/// Latency percentiles of a set of samples.
#[derive(Clone, Debug, Default)]
pub(super) struct Latency {
    pub(super) samples: Vec<Duration>,
}

impl Latency {
    pub(super) fn percentile(&self, p: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v = self.samples.clone();
        v.sort();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }

    pub(super) fn show(&self) -> String {
        match (self.percentile(50.0), self.percentile(99.0)) {
            (Some(p50), Some(p99)) => {
                format!("{} / {} (n={})", ms(p50), ms(p99), self.samples.len())
            }
            _ => "no samples".into(),
        }
    }
}

/// Waits until the `latency` Deployment has `replicas`; returns false on timeout.
pub(super) async fn deployment_reaches(
    env: &Env,
    replicas: i64,
    timeout: Duration,
) -> Result<bool> {
    if let Some(server) = &env.server {
        // Poll the store directly from a thread: sub-millisecond resolution, no HTTP.
        let (server, ns) = (server.clone(), env.latency_namespace().to_string());
        return Ok(tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                let live = server.get_object("apps/v1", "deployments", Some(&ns), LATENCY_CR);
                if live.as_ref().and_then(|d| d["spec"]["replicas"].as_i64()) == Some(replicas) {
                    return true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            false
        })
        .await?);
    }
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), env.latency_namespace());
    let cond = move |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
            .map(i64::from)
            == Some(replicas)
    };
    Ok(tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api, LATENCY_CR, cond),
    )
    .await
    .is_ok())
}

/// Times `samples` spec changes of the `latency` Memcached (size 3 ↔ 4) until its Deployment
/// shows them, pausing between changes; stops early when `stop` says so.
pub(super) async fn measure_latency(
    env: &Env,
    samples: usize,
    timeout: Duration,
    stop: impl Fn() -> bool,
) -> Result<Latency> {
    let api = env.memcacheds(env.latency_namespace());
    let mut latency = Latency::default();
    for i in 0..samples {
        if stop() {
            break;
        }
        let size = if i % 2 == 0 { SIZE + 1 } else { SIZE };
        let started = Instant::now();
        api.patch(
            LATENCY_CR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": size}})),
        )
        .await?;
        if !deployment_reaches(env, i64::from(size), timeout).await? {
            return Err(format!(
                "the latency Deployment did not reach {size} replicas in {timeout:?}"
            )
            .into());
        }
        latency.samples.push(started.elapsed());
        // Pauses of 50–150 ms, not in step with anything periodic.
        tokio::time::sleep(Duration::from_millis(50 + (i as u64 * 37) % 100)).await;
    }
    Ok(latency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latency {
            samples: (1..=100).map(Duration::from_millis).collect(),
        };
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(Latency::default().percentile(50.0), None);
    }
}
