//! The Memcached operator: desired-state builders (pure), drift detection, status
//! computation (pure) and the controller that applies them. The generator (`crates/gen`)
//! writes the deployment files from this library; the demo (`crates/demo`) runs it.

pub mod builders;
pub mod cached;
pub mod children;
pub mod client;
pub mod cmd;
pub mod controller;
pub mod crd;
pub mod drift;
pub mod informer;
pub mod proxy;
pub mod rbac;
pub mod samples;
pub mod status;
pub mod tls_agent;
pub mod triggers;
pub mod webhook;
