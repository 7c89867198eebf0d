//! What an upgrade of the operator may change in a running pool's pods: nothing memcached
//! does not need.
//!
//! Some parts of the pool's pod template are decided by the operator's own version, not by
//! the Memcached: the TLS reload agent, the exporter sidecar, the volumes of the Secrets and
//! of extstore (their images, commands and shapes), and the memory derived for memcached
//! when the spec names none. When only they would change, a running
//! pool keeps their live form ([`keep_live`]) until its template changes for a reason of its
//! own (a spec change, a rotated Secret), and then takes everything new in that one
//! rollout. A new default memcached image (for pools that name none) changes memcached
//! itself, so it rolls, but only a few pools at a time across the fleet ([`RolloutSlots`]):
//! an operator upgrade never flushes every cache at once.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use memcached_api::Memcached;
use serde_json::Value;

use crate::builders::{
    self, CONTAINER_NAME, EXPORTER_NAME, EXTSTORE_VOLUME, SASL_CONF_ANNOTATION, SASL_CONF_PATH_ENV,
    TLS_AGENT_NAME,
};
use crate::cached::{CacheForm, CachedDeployment};
use crate::informer::Store;

/// The pod template's containers whose live form a pool keeps: `(list, name)`.
const KEPT_CONTAINERS: [(&str, &str); 2] = [
    ("initContainers", TLS_AGENT_NAME),
    ("containers", EXPORTER_NAME),
];

/// The pod template's volumes whose live form a pool keeps: the Secrets', the reload
/// agent's state and extstore's.
pub const KEPT_VOLUMES: [&str; 4] = ["sasl", "tls", "tls-reload-agent", EXTSTORE_VOLUME];

/// `new` (the pool's desired Deployment) with the live form of the parts listed above taken
/// from `live` (the live Deployment's spec, as JSON) where it still says what the spec
/// says ([`spec_agrees`]), and, unless `mc` names its image and while `hold_image`, the
/// live memcached image; `None` when that is `new` itself. `serving`: whether any of the
/// live Deployment's pods is available (see [`keep_sasl_without_conf`]).
pub fn keep_live(
    mc: &Memcached,
    new: &Deployment,
    live: &Value,
    hold_image: bool,
    serving: bool,
) -> Option<Deployment> {
    let live_pod = live.pointer("/template/spec")?;
    let mut json = serde_json::to_value(new).ok()?;
    if serving {
        keep_sasl_without_conf(mc, json.pointer_mut("/spec/template")?, live_pod);
    }
    let pod = json.pointer_mut("/spec/template/spec")?;
    for (list, name) in KEPT_CONTAINERS {
        take_named(mc, pod, live_pod, list, name);
    }
    for name in KEPT_VOLUMES {
        take_named(mc, pod, live_pod, "volumes", name);
    }
    keep_earlier_memory(mc, pod, live_pod);
    if hold_image && mc.spec.image.is_none() {
        let live_image = named(live_pod, "containers", CONTAINER_NAME)
            .and_then(|c| c.get("image"))
            .cloned();
        if let (Some(image), Some(ours)) =
            (live_image, named_mut(pod, "containers", CONTAINER_NAME))
        {
            ours["image"] = image;
        }
    }
    let kept: Deployment = serde_json::from_value(json).ok()?;
    (kept != *new).then_some(kept)
}

/// A SASL pool of an operator that gave memcached no SASL configuration (its `sasl` volume
/// a bare Secret, no `SASL_CONF_PATH`) whose pods serve anyway (its image has its own
/// configuration) keeps that form: `template` (the new pod template, as JSON) gets the live
/// volume back, without the configuration's variable and annotation. Called only for a
/// Deployment with an available pod: a pool whose memcached exits at start for want of the
/// configuration (the official images) has nothing to keep and takes the new form.
fn keep_sasl_without_conf(mc: &Memcached, template: &mut Value, live_pod: &Value) {
    let Some(sasl) = &mc.spec.sasl else { return };
    let Some(live) = named(live_pod, "volumes", "sasl") else {
        return;
    };
    if live.pointer("/secret/secretName").and_then(Value::as_str) != Some(&sasl.secret_name) {
        return;
    }
    let live = live.clone();
    if let Some(pod) = template.get_mut("spec") {
        if let Some(ours) = named_mut(pod, "volumes", "sasl") {
            *ours = live;
        }
        if let Some(env) = named_mut(pod, "containers", CONTAINER_NAME)
            .and_then(|c| c.get_mut("env"))
            .and_then(Value::as_array_mut)
        {
            env.retain(|e| e.get("name").and_then(Value::as_str) != Some(SASL_CONF_PATH_ENV));
        }
    }
    if let Some(annotations) = template
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(SASL_CONF_ANNOTATION);
    }
}

/// A pool whose memory the operator derives (`spec.resources` unset) keeps its live
/// memcached resources while they are exactly what releases up to 0.2 derived for this same
/// spec ([`builders::earlier_default_resources`]): the newer, larger derivation reaches it
/// with the next rollout of its own, instead of restarting every pool on the upgrade.
fn keep_earlier_memory(mc: &Memcached, pod: &mut Value, live_pod: &Value) {
    if mc.spec.resources.is_some() {
        return;
    }
    let Some(live) = named(live_pod, "containers", CONTAINER_NAME).and_then(|c| c.get("resources"))
    else {
        return;
    };
    let Ok(earlier) = serde_json::to_value(builders::earlier_default_resources(&mc.spec)) else {
        return;
    };
    if *live == earlier
        && let Some(ours) = named_mut(pod, "containers", CONTAINER_NAME)
    {
        ours["resources"] = earlier;
    }
}

fn named<'a>(pod: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    pod.get(list)?
        .as_array()?
        .iter()
        .find(|item| item.get("name").and_then(Value::as_str) == Some(name))
}

fn named_mut<'a>(pod: &'a mut Value, list: &str, name: &str) -> Option<&'a mut Value> {
    pod.get_mut(list)?
        .as_array_mut()?
        .iter_mut()
        .find(|item| item.get("name").and_then(Value::as_str) == Some(name))
}

/// Replaces the item `name` of `pod`'s `list` with `live_pod`'s, when both have one and
/// the live one still says what the spec says.
fn take_named(mc: &Memcached, pod: &mut Value, live_pod: &Value, list: &str, name: &str) {
    if let (Some(live), Some(ours)) = (named(live_pod, list, name), named_mut(pod, list, name))
        && spec_agrees(mc, name, live, ours)
    {
        *ours = live.clone();
    }
}

/// Whether the live form of a kept part holds what the Memcached's spec puts in it (the
/// new form `ours` is built from the spec): only what the operator decides may differ. A
/// pool whose spec moved a kept part (another exporter image, Secret or StorageClass) takes
/// the new form.
fn spec_agrees(mc: &Memcached, name: &str, live: &Value, ours: &Value) -> bool {
    let same = |pointer: &str| live.pointer(pointer) == ours.pointer(pointer);
    match name {
        EXPORTER_NAME => {
            mc.spec.exporter.as_ref().is_none_or(|e| e.image.is_none()) || same("/image")
        }
        // The Secret, and with client authentication from a Secret of its own, the
        // projected sources (the spec's choice). Turning client authentication on or off
        // changes memcached's flags, so the template changes anyway; an earlier release's
        // volume without `items` is kept.
        "tls" => same("/secret/secretName") && same("/projected"),
        // The live form with SASL's configuration (the old form: `keep_sasl_without_conf`).
        "sasl" => same("/projected/sources/0/secret/name"),
        EXTSTORE_VOLUME => {
            same("/emptyDir/medium")
                && live.get("emptyDir").is_some() == ours.get("emptyDir").is_some()
                && same("/ephemeral/volumeClaimTemplate/spec/storageClassName")
        }
        _ => true,
    }
}

/// Whether a field manager other than `ours` holds a field of the parts a pool keeps (see
/// [`keep_live`]) in a Deployment's `managedFields`: an edit of them, by `kubectl` or
/// another tool, which the apply must take back rather than keep.
pub fn edited_by_others(managed: Option<&[ManagedFieldsEntry]>, ours: &str) -> bool {
    let item = |name: &str| format!("k:{{\"name\":\"{name}\"}}");
    managed.into_iter().flatten().any(|entry| {
        if entry.manager.as_deref() == Some(ours) {
            return false;
        }
        let Some(pod) = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.pointer("/f:spec/f:template/f:spec"))
        else {
            return false;
        };
        let holds = |list: &str, name: &str| {
            pod.get(list)
                .and_then(|items| items.get(item(name)))
                .is_some()
        };
        KEPT_CONTAINERS
            .iter()
            .any(|(list, name)| holds(&format!("f:{list}"), name))
            || KEPT_VOLUMES.iter().any(|name| holds("f:volumes", name))
            // The memcached image and derived memory a pool may hold (see `keep_live`).
            || ["f:image", "f:resources"].iter().any(|field| {
                pod.get("f:containers")
                    .and_then(|c| c.get(item(CONTAINER_NAME)))
                    .and_then(|c| c.get(field))
                    .is_some()
            })
    })
}

/// The memcached image of a Deployment.
pub fn memcached_image(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)?
        .image
        .as_deref()
}

/// The pod template of a Deployment's JSON (cached or as the server answered).
pub fn template(deployment: &Value) -> Option<&Value> {
    deployment.pointer("/spec/template")
}

/// A fleet-wide budget of pools rolling at once for a new default memcached image: a pool
/// takes a slot when fewer than `max` other pools are mid-rollout (for whatever reason,
/// read from the cached Deployments of every scope the operator watches, plus those this
/// process has just started and the caches do not show yet). The slot is free again when
/// the pool's rollout is done.
#[derive(Debug)]
pub struct RolloutSlots {
    max: usize,
    /// The Deployment cache of every watched scope (a namespace, or all: `None`).
    stores: Mutex<HashMap<Option<String>, Store<CachedDeployment>>>,
    /// Pools whose image rollout this process started, with the Deployment's generation
    /// after that write, until the cache shows it.
    started: Mutex<HashMap<ObjectRef<Memcached>, i64>>,
}

impl RolloutSlots {
    /// A budget of `max` pools rolling at once (at least one).
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            stores: Mutex::default(),
            started: Mutex::default(),
        }
    }

    /// Counts the pools of `store`, the Deployment cache of `scope`, too.
    pub fn watch(&self, scope: Option<String>, store: Store<CachedDeployment>) {
        self.stores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(scope, store);
    }

    /// How many pools other than `pool` are rolling now.
    pub fn rolling(&self, pool: &ObjectRef<Memcached>) -> usize {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.count(&mut started, pool)
    }

    /// Pools other than `pool` rolling: their cached Deployment's rollout is not done, or
    /// this process started (or is starting) one the cache does not show yet. Forgets the
    /// starts the cache shows.
    fn count(
        &self,
        started: &mut HashMap<ObjectRef<Memcached>, i64>,
        pool: &ObjectRef<Memcached>,
    ) -> usize {
        let stores: Vec<_> = self
            .stores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let mut rolling = HashSet::new();
        let mut pools = HashSet::new();
        for d in stores.iter().flat_map(Store::state) {
            let Some(other) = pool_of(&d) else { continue };
            let seen = started
                .get(&other)
                .is_none_or(|g| d.metadata.generation.unwrap_or(0) >= *g);
            if seen {
                started.remove(&other);
            }
            if other != *pool && (!seen || !rollout_done(&d)) {
                rolling.insert(other.clone());
            }
            pools.insert(other);
        }
        // A start of a pool whose Deployment is gone is forgotten; those the cache does not
        // show yet (being written now) count.
        started.retain(|p, _| pools.contains(p));
        rolling.extend(started.keys().filter(|p| *p != pool).cloned());
        rolling.len()
    }

    /// Takes a slot for `pool` if one is free: the pool counts as rolling from now on, until
    /// [`RolloutSlots::started`] says which generation of its Deployment rolls (or
    /// [`RolloutSlots::give_back`] says the write failed).
    pub fn try_take(&self, pool: &ObjectRef<Memcached>) -> bool {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        // Its own start, which the cache does not show yet: still its slot (so a stale
        // cache never makes it take the old image back).
        if started.contains_key(pool) {
            return true;
        }
        if self.count(&mut started, pool) >= self.max {
            return false;
        }
        started.insert(pool.clone(), i64::MAX);
        true
    }

    /// Records that `pool`'s rollout was started by a write leaving its Deployment at
    /// `generation`.
    pub fn started(&self, pool: ObjectRef<Memcached>, generation: i64) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pool, generation);
    }

    /// Gives `pool`'s slot back: the write that would have started its rollout failed.
    pub fn give_back(&self, pool: &ObjectRef<Memcached>) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(pool);
    }

    /// The most pools rolling at once.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Default for RolloutSlots {
    fn default() -> Self {
        Self::new(super::DEFAULT_MAX_CONCURRENT_POOL_ROLLOUTS)
    }
}

/// The Memcached a pool Deployment belongs to (a Deployment named as the Memcached that
/// controls it; the proxy's Deployment is `NAME-proxy`).
fn pool_of(d: &CachedDeployment) -> Option<ObjectRef<Memcached>> {
    let owner = d
        .owners()
        .into_iter()
        .find(|o| o.controller == Some(true) && o.kind == "Memcached")?;
    (owner.api_version == Memcached::api_version(&()) && owner.name == d.name_any())
        .then(|| ObjectRef::new(&owner.name).within(d.namespace().as_deref().unwrap_or_default()))
}

/// Whether a Deployment holds no rollout slot: its rollout is done (the controller saw its
/// latest spec, and only updated pods remain, all available), or stuck (past its progress
/// deadline: broken, not rolling; it must not hold the fleet's other pools back).
fn rollout_done(d: &CachedDeployment) -> bool {
    let want = d.replicas().unwrap_or(1);
    let Some(s) = d.status.as_ref() else {
        return want == 0;
    };
    let stuck = s.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.reason.as_deref() == Some(crate::status::PROGRESS_DEADLINE_EXCEEDED)
    });
    if stuck {
        return true;
    }
    let observed = match (s.observed_generation, d.metadata.generation) {
        (Some(seen), Some(current)) => seen >= current,
        _ => false,
    };
    observed
        && s.updated_replicas.unwrap_or(0) >= want
        && s.replicas.unwrap_or(0) == want
        && s.available_replicas.unwrap_or(0) >= want
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::{self, BuildSettings, SecretVersions};
    use memcached_api::{ExporterSpec, ExtstoreSpec, MemcachedSpec, SaslSpec, TlsSpec};

    fn pool(edit: impl FnOnce(&mut MemcachedSpec)) -> Memcached {
        let mut mc = Memcached::new("cache", MemcachedSpec::with_size(3));
        mc.metadata.namespace = Some("default".into());
        mc.metadata.uid = Some("uid-1".into());
        edit(&mut mc.spec);
        mc
    }

    fn every_helper(s: &mut MemcachedSpec) {
        s.tls = Some(TlsSpec::secret("certs"));
        s.exporter = Some(ExporterSpec {
            enabled: true,
            image: None,
        });
        s.extstore = Some(Box::new(ExtstoreSpec {
            enabled: true,
            ..ExtstoreSpec::default()
        }));
    }

    fn deployment(mc: &Memcached, settings: &BuildSettings) -> Deployment {
        builders::desired_deployment_with(mc, settings, &SecretVersions::default()).expect("builds")
    }

    fn spec_json(d: &Deployment) -> Value {
        serde_json::to_value(d.spec.as_ref().expect("spec")).expect("json")
    }

    #[test]
    fn an_upgrade_that_moves_only_helpers_keeps_the_live_template() {
        let mc = pool(every_helper);
        let before = BuildSettings {
            tls_agent_image: "registry.example/operator:0.1.0".into(),
            default_exporter_image: "registry.example/exporter:1".into(),
            ..BuildSettings::default()
        };
        let after = BuildSettings {
            tls_agent_image: "registry.example/tls-agent:0.2.0".into(),
            default_exporter_image: "registry.example/exporter:2".into(),
            ..BuildSettings::default()
        };
        let live = deployment(&mc, &before);
        let new = deployment(&mc, &after);
        assert_ne!(live, new);
        let kept = keep_live(&mc, &new, &spec_json(&live), true, true).expect("keeps");
        assert_eq!(kept, live, "the helpers as they run");
    }

    #[test]
    fn a_new_default_image_is_held_only_for_pools_that_name_none() {
        let before = BuildSettings {
            default_image: "memcached:1.6.38".into(),
            ..BuildSettings::default()
        };
        let after = BuildSettings {
            default_image: "memcached:1.6.39".into(),
            ..BuildSettings::default()
        };
        let unpinned = pool(|_| {});
        let live = deployment(&unpinned, &before);
        let new = deployment(&unpinned, &after);
        let held = keep_live(&unpinned, &new, &spec_json(&live), true, true).expect("holds");
        assert_eq!(memcached_image(&held), Some("memcached:1.6.38"));
        assert_eq!(
            keep_live(&unpinned, &new, &spec_json(&live), false, true),
            None
        );

        let pinned = pool(|s| s.image = Some("memcached:1.6.30".into()));
        let live = deployment(&pinned, &before);
        let new = deployment(&pinned, &after);
        assert_eq!(
            keep_live(&pinned, &new, &spec_json(&live), true, true),
            None
        );
    }

    /// The live Deployment an earlier release made for `mc`: today's, with the memory
    /// releases up to 0.2 derived.
    fn with_earlier_memory(mc: &Memcached, settings: &BuildSettings) -> Deployment {
        let mut live = deployment(mc, settings);
        if let Some(pod) = live.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            pod.containers[0].resources = Some(builders::earlier_default_resources(&mc.spec));
        }
        live
    }

    #[test]
    fn an_upgrade_keeps_the_memory_an_earlier_release_derived_until_the_pool_rolls() {
        let settings = BuildSettings::default();
        for mc in [pool(|_| {}), pool(every_helper)] {
            let live = with_earlier_memory(&mc, &settings);
            let new = deployment(&mc, &settings);
            assert_ne!(live, new, "the derived memory grew");
            let kept = keep_live(&mc, &new, &spec_json(&live), true, true).expect("keeps");
            assert_eq!(kept, live, "the memory as it runs");
        }
        // A spec that moves the cache takes the new memory with its own rollout.
        let live = with_earlier_memory(&pool(|_| {}), &settings);
        let bigger = pool(|s| {
            s.config = Some(memcached_api::MemcachedConfig {
                memory_mib: 256,
                ..memcached_api::MemcachedConfig::default()
            })
        });
        let new = deployment(&bigger, &settings);
        assert_eq!(
            keep_live(&bigger, &new, &spec_json(&live), true, true),
            None
        );
        // Memory the spec names is the spec's.
        let named = pool(|s| s.resources = Some(builders::earlier_default_resources(s)));
        let live = deployment(&named, &settings);
        let new_named = pool(|s| {
            s.resources = Some(builders::earlier_default_resources(s));
            if let Some(limits) = s.resources.as_mut().and_then(|r| r.limits.as_mut()) {
                limits.insert(
                    "memory".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("200Mi".into()),
                );
            }
        });
        let new = deployment(&new_named, &settings);
        assert_eq!(
            keep_live(&new_named, &new, &spec_json(&live), true, true),
            None
        );
    }

    #[test]
    fn what_the_spec_changes_is_not_kept() {
        let settings = BuildSettings::default();
        let live = deployment(&pool(every_helper), &settings);
        let mc = pool(|s| {
            every_helper(s);
            s.config = Some(memcached_api::MemcachedConfig {
                memory_mib: 256,
                ..memcached_api::MemcachedConfig::default()
            });
        });
        let new = deployment(&mc, &settings);
        // The helpers are the same, so nothing is kept: the new template is applied.
        assert_eq!(keep_live(&mc, &new, &spec_json(&live), true, true), None);
    }

    #[test]
    fn a_helper_the_spec_moved_is_not_kept() {
        let settings = BuildSettings::default();
        let live = deployment(&pool(every_helper), &settings);
        let exporter = pool(|s| {
            every_helper(s);
            s.exporter = Some(ExporterSpec {
                enabled: true,
                image: Some("registry.example/exporter:3".into()),
            });
        });
        let new = deployment(&exporter, &settings);
        assert_eq!(
            keep_live(&exporter, &new, &spec_json(&live), true, true),
            None
        );
        let secret = pool(|s| {
            every_helper(s);
            s.tls = Some(TlsSpec::secret("renewed-certs"));
        });
        let new = deployment(&secret, &settings);
        assert_eq!(
            keep_live(&secret, &new, &spec_json(&live), true, true),
            None
        );
        let class = pool(|s| {
            every_helper(s);
            if let Some(ext) = s.extstore.as_mut() {
                ext.storage_class_name = Some("fast".into());
            }
        });
        let new = deployment(&class, &settings);
        assert_eq!(keep_live(&class, &new, &spec_json(&live), true, true), None);
        // The client CA moved to a Secret of its own: memcached's flags are the same, the
        // volume is not.
        let client_auth = |ca: Option<&str>| {
            pool(|s| {
                every_helper(s);
                s.tls = Some(TlsSpec {
                    client_auth: Some(memcached_api::ClientAuthSpec {
                        ca_secret_name: ca.map(String::from),
                        verify: None,
                    }),
                    ..TlsSpec::secret("certs")
                });
            })
        };
        let live = deployment(&client_auth(None), &settings);
        let own_ca = client_auth(Some("client-ca"));
        let new = deployment(&own_ca, &settings);
        assert_eq!(
            keep_live(&own_ca, &new, &spec_json(&live), true, true),
            None
        );
    }

    #[test]
    fn an_earlier_releases_whole_secret_volume_is_kept() {
        // Releases up to 0.1 mounted the whole TLS Secret, without `items`.
        let settings = BuildSettings::default();
        let mc = pool(every_helper);
        let new = deployment(&mc, &settings);
        let mut live = spec_json(&new);
        let tls = live
            .pointer_mut("/template/spec/volumes")
            .and_then(Value::as_array_mut)
            .and_then(|v| v.iter_mut().find(|v| v["name"] == "tls"))
            .expect("the tls volume");
        tls["secret"]
            .as_object_mut()
            .expect("a Secret volume")
            .remove("items");
        let kept = keep_live(&mc, &new, &live, true, true).expect("keeps");
        let volume = kept
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.volumes)
            .and_then(|v| v.into_iter().find(|v| v.name == "tls"))
            .expect("the tls volume");
        assert_eq!(volume.secret.and_then(|s| s.items), None, "the live form");
    }

    #[test]
    fn a_kept_part_another_tool_edited_is_taken_back() {
        let entry = |manager: &str, fields: Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                fields,
            )),
            ..ManagedFieldsEntry::default()
        };
        let exporter_image = serde_json::json!({"f:spec": {"f:template": {"f:spec": {
            "f:containers": {"k:{\"name\":\"exporter\"}": {"f:image": {}}}}}}});
        let ours = [entry("memcached-operator", exporter_image.clone())];
        assert!(!edited_by_others(Some(&ours), "memcached-operator"));
        let kubectl = [
            entry("memcached-operator", exporter_image.clone()),
            entry("kubectl-set", exporter_image),
        ];
        assert!(edited_by_others(Some(&kubectl), "memcached-operator"));
        let scaled = [entry(
            "kubectl-scale",
            serde_json::json!({"f:spec": {"f:replicas": {}}}),
        )];
        assert!(!edited_by_others(Some(&scaled), "memcached-operator"));
        let volume = [entry(
            "kubectl-edit",
            serde_json::json!({"f:spec": {"f:template": {"f:spec": {
                "f:volumes": {"k:{\"name\":\"tls\"}": {"f:secret": {}}}}}}}),
        )];
        assert!(edited_by_others(Some(&volume), "memcached-operator"));
    }

    /// `d` as an operator without SASL's configuration built it: the `sasl` volume a bare
    /// Secret, no `SASL_CONF_PATH`, no annotation.
    fn without_sasl_conf(d: &Deployment) -> Value {
        let mut spec = spec_json(d);
        let template = spec.pointer_mut("/template").expect("template");
        template["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(SASL_CONF_ANNOTATION);
        let pod = &mut template["spec"];
        let secret = named(pod, "volumes", "sasl").expect("sasl")["projected"]["sources"][0]
            ["secret"]["name"]
            .clone();
        *named_mut(pod, "volumes", "sasl").expect("sasl") = serde_json::json!({
            "name": "sasl",
            "secret": {"secretName": secret, "defaultMode": 0o440,
                       "items": [{"key": "sasl-pwdb", "path": "sasl-pwdb"}]},
        });
        named_mut(pod, "containers", CONTAINER_NAME).expect("memcached")["env"]
            .as_array_mut()
            .expect("env")
            .retain(|e| e["name"] != SASL_CONF_PATH_ENV);
        spec
    }

    #[test]
    fn a_sasl_pool_without_sasl_configuration_keeps_its_form_only_while_it_serves() {
        let settings = BuildSettings::default();
        let mc = pool(|s| {
            every_helper(s);
            s.sasl = Some(SaslSpec {
                secret_name: "auth".into(),
            });
        });
        let new = deployment(&mc, &settings);
        let live = without_sasl_conf(&new);
        assert_ne!(spec_json(&new), live);
        // Its pods serve (its image has a configuration of its own): nothing restarts.
        let kept = keep_live(&mc, &new, &live, true, true).expect("keeps");
        assert_eq!(spec_json(&kept), live, "the template as it runs");
        // None serves (memcached exited for want of one): the configuration comes with the
        // new template.
        assert_eq!(keep_live(&mc, &new, &live, true, false), None);
        // Another Secret: the new form, whatever runs.
        let moved = pool(|s| {
            every_helper(s);
            s.sasl = Some(SaslSpec {
                secret_name: "other".into(),
            });
        });
        let new = deployment(&moved, &settings);
        assert_eq!(keep_live(&moved, &new, &live, true, true), None);
        // A pool that has the configuration keeps it.
        let current = spec_json(&deployment(&mc, &settings));
        assert_eq!(
            keep_live(&mc, &deployment(&mc, &settings), &current, true, true),
            None
        );
    }

    #[test]
    fn every_volume_of_the_pool_is_a_helper_volume() {
        let mc = pool(|s| {
            every_helper(s);
            s.sasl = Some(SaslSpec {
                secret_name: "auth".into(),
            });
        });
        let d = deployment(&mc, &BuildSettings::default());
        let volumes = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.volumes)
            .unwrap_or_default();
        assert!(volumes.len() >= 3);
        for v in volumes {
            assert!(
                KEPT_VOLUMES.contains(&v.name.as_str()),
                "{} is not kept",
                v.name
            );
        }
    }
}
