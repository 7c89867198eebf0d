//! A Deployment of ours as cached ([`CachedDeployment`]): the rollout counts of its status
//! typed, its spec kept as JSON text for the drift check.

use std::borrow::Cow;
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde_json::Value;

use super::*;

/// A Deployment of ours, as cached: metadata (without managedFields) and the status's rollout
/// counts typed, `spec.replicas` read out; labels, annotations, ownerReferences and the whole
/// spec kept as JSON text for the drift check.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireDeployment")]
pub struct CachedDeployment {
    /// Without labels, annotations and ownerReferences: see [`CacheForm::meta_text`].
    pub metadata: ObjectMeta,
    meta_text: MetaText,
    /// `spec.replicas` (the API server defaults it to 1).
    pub replicas: Option<i32>,
    spec: SharedText,
    pub status: Option<DeploymentStatus>,
    verified: Verified,
}

impl CachedDeployment {
    /// The spec's shared text (the same allocation as every Deployment's whose spec differs
    /// only in its name).
    pub fn spec_shared(&self) -> &SharedText {
        &self.spec
    }

    /// The Deployment without its spec, labels, annotations and ownerReferences: what the
    /// Memcached's status is computed from (its generation and status).
    pub fn without_spec(&self) -> Deployment {
        Deployment {
            metadata: self.metadata.clone(),
            spec: None,
            status: self.status.clone(),
        }
    }
}

resource_as!(CachedDeployment, Deployment);

#[derive(Deserialize)]
struct WireDeployment {
    #[serde(default)]
    metadata: WireMeta,
    #[serde(default)]
    spec: JsonText,
    #[serde(default)]
    status: Option<WireDeploymentStatus>,
}

/// The rollout counts of a Deployment's status, and of its conditions only the one that
/// says the rollout is stuck (`Progressing=False`, `ProgressDeadlineExceeded`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDeploymentStatus {
    available_replicas: Option<i32>,
    observed_generation: Option<i64>,
    ready_replicas: Option<i32>,
    replicas: Option<i32>,
    updated_replicas: Option<i32>,
    #[serde(default)]
    conditions: Vec<WireDeploymentCondition>,
}

#[derive(Deserialize)]
struct WireDeploymentCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl From<WireDeploymentStatus> for DeploymentStatus {
    fn from(s: WireDeploymentStatus) -> Self {
        let stuck: Vec<DeploymentCondition> = s
            .conditions
            .into_iter()
            .filter(|c| {
                c.type_ == "Progressing"
                    && c.reason.as_deref() == Some(crate::status::PROGRESS_DEADLINE_EXCEEDED)
            })
            .map(|c| DeploymentCondition {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                message: c.message,
                ..DeploymentCondition::default()
            })
            .collect();
        DeploymentStatus {
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            ready_replicas: s.ready_replicas,
            replicas: s.replicas,
            updated_replicas: s.updated_replicas,
            conditions: (!stuck.is_empty()).then_some(stuck),
            ..DeploymentStatus::default()
        }
    }
}

impl From<WireDeployment> for CachedDeployment {
    fn from(d: WireDeployment) -> Self {
        #[derive(Deserialize)]
        struct Replicas {
            replicas: Option<i32>,
        }
        let (metadata, meta_text) = d.metadata.split();
        let replicas = serde_json::from_str::<Replicas>(d.spec.as_str())
            .ok()
            .and_then(|s| s.replicas);
        CachedDeployment {
            spec: SharedText::new(d.spec, [metadata.name.as_deref(), None, None]),
            metadata,
            meta_text,
            replicas,
            status: d.status.map(DeploymentStatus::from),
            verified: Verified::default(),
        }
    }
}

impl CacheForm for CachedDeployment {
    type Full = Deployment;

    fn live_json(&self) -> Option<Value> {
        let spec = self.spec.text([self.metadata.name.as_deref(), None, None]);
        let mut json = object_json::<Deployment>(&self.metadata, &self.meta_text, &spec)?;
        json["status"] = serde_json::to_value(&self.status).ok()?;
        Some(json)
    }

    fn meta_text(&self) -> &MetaText {
        &self.meta_text
    }

    fn verified(&self) -> &Verified {
        &self.verified
    }

    fn replicas(&self) -> Option<i32> {
        self.replicas
    }
}
