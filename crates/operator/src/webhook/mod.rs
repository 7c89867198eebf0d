//! Admission webhooks for Memcached, as a Kubebuilder project serves them: a mutating
//! (defaulting) webhook and a validating one, speaking `admission.k8s.io/v1`
//! AdmissionReview over TLS, with the certificate read from a directory (`tls.crt`,
//! `tls.key`, reloaded when they change).
//!
//! - **Defaulting** applies exactly the defaults the CRD schema declares (read from the
//!   generated schema, so the two cannot drift: today `spec.containerPort: 11211`) and
//!   returns them as a JSON patch; a complete object gets no patch. `spec.image` is *not*
//!   defaulted: the schema does not default it and the reconciler resolves an unset image
//!   to the operator's `--memcached-image` at each reconcile. Writing the default into the
//!   object would make objects differ by the path that created them (webhook on or off)
//!   and would freeze today's default into every pool, so upgrading the operator's default
//!   image would no longer roll them.
//! - **Validation** checks what the schema cannot (see [`memcached_api::validation`]):
//!   names that would make invalid child names, a port reserved for the exporter sidecar,
//!   image references that cannot be pulled; and, defensively (the API server normally
//!   does this first), wrong types, unknown fields, a missing spec and a wrong
//!   apiVersion/kind. No field is immutable. Risky but legal choices get warnings.
//! - **Bad requests** (not JSON, not an `admission.k8s.io/v1` AdmissionReview, no request)
//!   get HTTP 400, bodies over [`MAX_BODY_BYTES`] (or whose decoding would take more than
//!   [`limits::MAX_REQUEST_BYTES`]) get 413, always with an AdmissionReview body whose
//!   `response.status.message` says what is wrong. Nothing here panics on input.
//! - **Floods** get 429 with `Retry-After` at once, in the same shape, beyond the bounds of
//!   [`limits`]: memory held for requests across connections, dry runs in flight. The server
//!   runs on a thread and runtime of its own ([`WebhookServer::spawn`]), so what it does
//!   never delays the renewal of the operator's Lease.
//!
//! The module is split by concern: `server` the HTTPS server, `decode` the decoding of
//! requests, `admission` the answers, [`dry_run`] the server-side dry run of the children
//! the reconciler would apply (walking the same list, [`crate::children`]), [`limits`] what
//! requests may hold at once, `schema` what the CRD schema says and `configuration` the
//! webhook configurations; all that is public is re-exported here, so callers name
//! everything `webhook::...`.

mod admission;
mod configuration;
mod decode;
pub mod dry_run;
pub mod limits;
mod schema;
mod server;

pub use admission::{Endpoint, handle, handle_checked, mutate, validate};
pub use configuration::webhook_configurations;
pub use decode::{BadRequest, DecodedReview, decode_memcached, decode_review, decoded_size};
pub use schema::{apply_schema_defaults, schema_defaults};
pub use server::{
    WebhookConfig, WebhookError, WebhookServer, WebhookThread, check_certificate, review_json,
    router, router_with, serve,
};

/// Path of the mutating (defaulting) webhook, as Kubebuilder names it.
pub const MUTATE_PATH: &str = "/mutate-memcached-cache-example-com-v1-memcached";
/// Path of the validating webhook, as Kubebuilder names it.
pub const VALIDATE_PATH: &str = "/validate-memcached-cache-example-com-v1-memcached";
/// controller-runtime's default webhook port.
pub const DEFAULT_PORT: u16 = 9443;
/// controller-runtime's default certificate directory.
pub const DEFAULT_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// Largest request body accepted (413 beyond): 1 MiB. A review carries the Memcached twice
/// on update (`object` and `oldObject`), and a Memcached stays far below 512 KiB: the API
/// server caps its annotations at 256 KiB in all, and its spec, status and managedFields
/// take a few KiB to tens of KiB. Kubernetes' own limit on a request (3 MiB) would let
/// each connection make the operator hold three times that for nothing a Memcached needs.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Name of the mutating webhook inside its configuration.
pub const MUTATING_WEBHOOK_NAME: &str = "mmemcached-v1.kb.io";
/// Name of the validating webhook inside its configuration.
pub const VALIDATING_WEBHOOK_NAME: &str = "vmemcached-v1.kb.io";
/// Name of the MutatingWebhookConfiguration.
pub const MUTATING_CONFIGURATION_NAME: &str = "memcached-operator-mutating-webhook-configuration";
/// Name of the ValidatingWebhookConfiguration.
pub const VALIDATING_CONFIGURATION_NAME: &str =
    "memcached-operator-validating-webhook-configuration";
/// How long the API server waits for an answer.
pub const TIMEOUT_SECONDS: i32 = 10;
/// The cert-manager annotation that injects the CA bundle into webhook configurations.
pub const CA_INJECTION_ANNOTATION: &str = "cert-manager.io/inject-ca-from";
