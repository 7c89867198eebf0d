//! The Secrets a Memcached's pods mount (SASL's password database, TLS's certificate and
//! key): read when a reconcile needs them, never listed or watched (that would hold every
//! Secret of the namespace in memory), and digested into the pod template's hash.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use memcached_api::Memcached;

use super::context::{Context, Error};
use crate::builders::{self, SecretVersions};
use crate::status::Problem;

/// Reads the SASL and TLS Secrets `mc` references. `Ok(Err(problem))` when one is missing
/// or lacks a key; `Err` only for API errors other than NotFound.
pub(super) async fn referenced_secrets(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
) -> Result<Result<SecretVersions, Problem>, Error> {
    let mut versions = SecretVersions::default();
    let wanted = [
        (
            "spec.sasl.secretName",
            mc.spec.sasl.as_ref().map(|s| s.secret_name.as_str()),
            &[builders::SASL_PWDB_KEY][..],
        ),
        (
            "spec.tls.secretName",
            mc.spec.tls.as_ref().map(|t| t.secret_name.as_str()),
            &builders::TLS_KEYS[..],
        ),
    ];
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    for (i, (field, secret, keys)) in wanted.into_iter().enumerate() {
        let Some(secret) = secret else { continue };
        let found = api.get_opt(secret).await.map_err(|source| Error::Apply {
            kind: "Secret",
            object: format!("{namespace}/{secret}"),
            source,
        })?;
        let Some(found) = found else {
            return Ok(Err(Problem {
                reason: "SecretNotFound".into(),
                message: format!(
                    "Secret \"{secret}\" ({field}) not found in namespace {namespace}"
                ),
            }));
        };
        let data = found.data.as_ref();
        if let Some(key) = keys
            .iter()
            .find(|k| data.is_none_or(|d| !d.contains_key(**k)))
        {
            return Ok(Err(Problem {
                reason: "SecretInvalid".into(),
                message: format!("Secret \"{secret}\" ({field}) has no key \"{key}\""),
            }));
        }
        let version = data.map(|d| {
            builders::secret_digest(
                keys.iter()
                    .map(|k| (*k, d.get(*k).map(|v| v.0.as_slice()).unwrap_or_default())),
            )
        });
        if i == 0 {
            versions.sasl = version;
        } else {
            versions.tls = version;
        }
    }
    Ok(Ok(versions))
}
