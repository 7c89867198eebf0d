//! Runtime concerns shared by any controller, kept apart from the Memcached logic:
//! the Rust counterpart of controller-runtime's manager. One module per concern.

pub mod health;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod serve;
pub mod shutdown;
pub mod webhook_tls;

pub use health::{Health, serve_probes};
pub use leader::{LeaderElectionConfig, run_as_leader};
pub use logging::LogFormat;
pub use metrics::{ControllerMetrics, Metrics, ReconcileResult, ReconcileTimer};
pub use metrics_server::{MetricsServer, MetricsServerConfig, serve_metrics};
pub use serve::ConnectionLimits;
pub use shutdown::signal_token;

#[cfg(test)]
mod test_http;
#[cfg(test)]
mod test_util;
