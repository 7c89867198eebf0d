//! Runtime concerns shared by any controller, kept apart from the Memcached logic:
//! the Rust counterpart of controller-runtime's manager. One module per concern.

pub mod health;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod shutdown;
pub mod webhook_tls;

pub use health::Health;
pub use metrics::{ControllerMetrics, Metrics, ReconcileResult};

#[cfg(test)]
mod test_http;
#[cfg(test)]
mod test_util;
