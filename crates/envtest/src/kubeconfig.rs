//! Kubeconfigs for a control plane (the admin's client certificate, or a bearer token) and
//! clients made from a kubeconfig file.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use crate::{Error, certs};

pub(crate) enum User<'a> {
    Cert(&'a str, &'a str),
    Token(&'a str),
}

fn b64(s: &str) -> String {
    certs::base64(s.as_bytes())
}

pub(crate) fn kubeconfig_yaml(url: &str, ca_pem: &str, user: User<'_>) -> String {
    let user = match user {
        User::Cert(cert, key) => json!({
            "client-certificate-data": b64(cert), "client-key-data": b64(key),
        }),
        User::Token(token) => json!({"token": token}),
    };
    serde_json::to_string_pretty(&json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {
            "server": url, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "envtest", "user": user}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest"}}],
        "current-context": "envtest",
    }))
    .unwrap_or_default()
}

pub(crate) async fn config_from_kubeconfig(path: &Path) -> Result<Config, Error> {
    let kc = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, Error> {
    Ok(Client::try_from(config_from_kubeconfig(path).await?)?)
}
