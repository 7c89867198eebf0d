//! The Secrets a Memcached's pods mount (SASL's password database, TLS's certificate and
//! key), digested into the pod template's hash. Their metadata is watched (the API server
//! sends no data on that watch, and the cache keeps only names and resourceVersions), which
//! says when one appears, changes or goes; the data is read (a GET) only when the
//! resourceVersion moved since it was last read. So a converged pool costs no request, and
//! a changed password is seen at once.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use memcached_api::Memcached;

use super::context::{Context, Error};
use crate::builders::{self, SecretVersions};
use crate::status::Problem;

/// A Secret's data as read: namespace, name and the keys read.
type ReadKey = (String, String, &'static [&'static str]);

/// What was read of a Secret's data, with the resourceVersion it was read at: the digest of
/// the keys, or the first key missing.
#[derive(Debug, Default)]
pub struct SecretReads(Mutex<HashMap<ReadKey, Read>>);

#[derive(Clone, Debug)]
struct Read {
    resource_version: String,
    digest: Result<String, &'static str>,
}

impl SecretReads {
    fn get(&self, key: &ReadKey, resource_version: &str) -> Option<Result<String, &'static str>> {
        let reads = self.0.lock().unwrap_or_else(|e| e.into_inner());
        reads
            .get(key)
            .filter(|r| r.resource_version == resource_version)
            .map(|r| r.digest.clone())
    }

    fn put(&self, key: ReadKey, read: Read) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, read);
    }

    fn forget(&self, key: &ReadKey) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// The Secrets `mc` references, by its field: `(field, Secret name, keys read)`. With
/// client authentication the CA's `ca.crt` is a third entry, read on its own (from its own
/// Secret or the TLS one): its version rolls the pods (see [`SecretVersions::client_ca`]).
pub(super) fn referenced(
    mc: &Memcached,
) -> [(&'static str, Option<&str>, &'static [&'static str]); 3] {
    let tls = mc.spec.tls.as_ref();
    let client_auth = tls.and_then(|t| t.client_auth.as_ref());
    let ca = match client_auth.map(|c| c.ca_secret_name.as_deref()) {
        None => ("spec.tls.clientAuth.caSecretName", None),
        Some(Some(own)) => ("spec.tls.clientAuth.caSecretName", Some(own)),
        Some(None) => ("spec.tls.clientAuth", tls.map(|t| t.secret_name.as_str())),
    };
    [
        (
            "spec.sasl.secretName",
            mc.spec.sasl.as_ref().map(|s| s.secret_name.as_str()),
            &[builders::SASL_PWDB_KEY],
        ),
        (
            "spec.tls.secretName",
            tls.map(|t| t.secret_name.as_str()),
            &builders::TLS_KEYS,
        ),
        (ca.0, ca.1, &builders::CA_KEYS),
    ]
}

/// The digests of the SASL and TLS Secrets `mc` references. `Ok(Err(problem))` when one is
/// missing or lacks a key; `Err` only for API errors other than NotFound.
pub(super) async fn referenced_secrets(
    ctx: &Context,
    mc: &Memcached,
    namespace: &str,
) -> Result<Result<SecretVersions, Problem>, Error> {
    let mut versions = SecretVersions::default();
    for (i, (field, secret, keys)) in referenced(mc).into_iter().enumerate() {
        let Some(secret) = secret else { continue };
        let not_found = || Problem {
            reason: "SecretNotFound".into(),
            message: format!("Secret \"{secret}\" ({field}) not found in namespace {namespace}"),
        };
        // The watch knows whether it exists, and which version it is.
        let cache_key = (namespace.to_string(), secret.to_string(), keys);
        let Some(meta) = ctx.secrets.get(&ObjectRef::new(secret).within(namespace)) else {
            ctx.secret_reads.forget(&cache_key);
            return Ok(Err(not_found()));
        };
        let seen = meta.metadata.resource_version.clone().unwrap_or_default();
        let digest = match ctx.secret_reads.get(&cache_key, &seen) {
            Some(digest) => digest,
            None => {
                let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
                let found = api.get_opt(secret).await.map_err(|source| Error::Apply {
                    kind: "Secret",
                    object: format!("{namespace}/{secret}"),
                    source,
                })?;
                let Some(found) = found else {
                    ctx.secret_reads.forget(&cache_key);
                    return Ok(Err(not_found()));
                };
                let digest = digest_of(&found, keys);
                ctx.secret_reads.put(
                    cache_key,
                    Read {
                        resource_version: found.metadata.resource_version.unwrap_or_default(),
                        digest: digest.clone(),
                    },
                );
                digest
            }
        };
        let digest = match digest {
            Ok(digest) => digest,
            Err(key) => {
                return Ok(Err(Problem {
                    reason: "SecretInvalid".into(),
                    message: format!("Secret \"{secret}\" ({field}) has no key \"{key}\""),
                }));
            }
        };
        match i {
            0 => versions.sasl = Some(digest),
            1 => versions.tls = Some(digest),
            _ => versions.client_ca = Some(digest),
        }
    }
    Ok(Ok(versions))
}

/// The digest of `keys` of `secret`, or the first of them it lacks.
fn digest_of(secret: &Secret, keys: &'static [&'static str]) -> Result<String, &'static str> {
    let data = secret.data.as_ref();
    if let Some(key) = keys
        .iter()
        .find(|k| data.is_none_or(|d| !d.contains_key(**k)))
    {
        return Err(key);
    }
    Ok(builders::secret_digest(keys.iter().map(|k| {
        (
            *k,
            data.and_then(|d| d.get(*k))
                .map(|v| v.0.as_slice())
                .unwrap_or_default(),
        )
    })))
}
