//! The one apply path: every child of the list ([`crate::children`]) is applied, checked
//! for drift and ownership, and deleted when no longer wanted here, whatever its kind.
//!
//! A child is written only when it differs from what the server would store for its
//! desired state ([`crate::drift`]): the cached child is compared with the desired one once
//! per version of either, and the server's normal form of a desired state is learned from
//! its answer to the apply (or, after a restart, from a dry run). A child of the right name
//! that another controller owns is never taken over.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use memcached_api::Memcached;
use serde::Serialize;
use serde_json::Value;
use tracing::{debug, info};

mod adopt;
mod delete;
mod pool;

use super::context::{Context, Error, object_key};
use super::events::Changes;
use crate::builders::{APPLIED_HASH_ANNOTATION, FIELD_MANAGER};
use crate::cached::{CacheForm, CachedDeployment};
use crate::children::{
    Child, Desired, Inputs, Keep, Kind, PROXY_DEPLOYMENT, Planned, Report, origins,
};
use crate::drift::{self, NormalForm};
use crate::informer::Cache;

/// The Memcached a child belongs to, as the normal forms are filed under.
pub(super) struct Owner {
    pub object: ObjectRef<Memcached>,
    pub key: u64,
    uid: Option<String>,
}

impl Owner {
    pub fn of(mc: &Memcached) -> Self {
        let object = ObjectRef::from_obj(mc);
        let key = owner_key(&object);
        Owner {
            object,
            key,
            uid: mc.metadata.uid.clone(),
        }
    }

    /// The child's controller, when it is not this Memcached: `Kind name (uid …)`.
    pub fn other_controller<K: CacheForm>(&self, child: &K) -> Option<String> {
        let controller = child
            .owners()
            .into_iter()
            .find(|o| o.controller == Some(true))?;
        (Some(&controller.uid) != self.uid.as_ref()).then(|| {
            format!(
                "{} {} (uid {})",
                controller.kind, controller.name, controller.uid
            )
        })
    }

    /// Whether this Memcached is the child's controller.
    pub fn controls<K: CacheForm>(&self, child: &K) -> bool {
        child
            .owners()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == self.uid.as_ref())
    }
}

/// The key the normal forms of a Memcached's children are filed under.
pub(super) fn owner_key(mc: &ObjectRef<Memcached>) -> u64 {
    drift::key((mc.namespace.as_deref(), &mc.name))
}

fn child_key(kind: &str, name: &str) -> u64 {
    drift::key((kind, name))
}

/// What an apply did.
enum Applied<T> {
    Unchanged(Arc<T>),
    Created(T),
    Updated { before: Arc<T>, after: T },
}

/// The children of one Memcached after [`apply_children`]: the live Deployments (the
/// Memcached's status is computed from them), by name.
#[derive(Default)]
pub(super) struct AppliedChildren {
    deployments: Vec<(String, Arc<CachedDeployment>)>,
    /// The pool's new default image waits for a rollout slot (of how many at once).
    pub rollout_waiting: Option<usize>,
}

impl AppliedChildren {
    /// The Deployment `name` as the apply left it.
    pub fn deployment(&self, name: &str) -> Option<&Arc<CachedDeployment>> {
        self.deployments
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d)
    }
}

/// What a Deployment's apply leaves for the reconcile.
struct ChildOutcome {
    /// The Deployment as the apply left it, by name.
    deployment: (String, Arc<CachedDeployment>),
    /// A new default image waiting for a rollout slot (of how many at once).
    waiting: Option<usize>,
}

/// Applies every wanted child of `plans` at once (they do not depend on each other, so a new
/// Memcached waits for one round trip, not one per child) and then deletes ours that are no
/// longer wanted. Children of a kind the server does not serve are skipped. What changed is
/// added to `changes` in the list's order (the ConfigMaps first), even when another child
/// failed; every failure is returned.
///
/// One dependency: the proxy's pods mount its ConfigMap (the routes and the start files
/// their command names), so the ConfigMaps are applied first and the proxy Deployment only
/// once they are. A proxy pod started before a start file of its command is in its volume
/// loads no routes and never reloads: memcached logs `Failed to load proxy_startfile`,
/// keeps running, answers every request with an error, and its TCP probe passes.
/// So a ConfigMap not applied (refused, or someone else's of that name) holds back the proxy
/// Deployment: its pods would mount a configuration the operator did not write.
pub(super) async fn apply_children(
    ctx: &Context,
    mc: &Memcached,
    owner: &Owner,
    plans: Vec<Planned<'_>>,
    inputs: &Inputs<'_>,
    changes: &mut Changes,
) -> Result<AppliedChildren, Error> {
    let mut mounted = Vec::new();
    let mut wanted = Vec::new();
    let mut unwanted = Vec::new();
    for plan in plans {
        if !ctx.served(plan.child.kind) {
            continue;
        }
        match plan.desired {
            Some(desired) if plan.child.kind == Kind::ConfigMap => {
                mounted.push((plan.child, desired))
            }
            Some(desired) => wanted.push((plan.child, desired)),
            None => unwanted.push((plan.child, plan.name)),
        }
    }
    let mut applied = AppliedChildren::default();
    let mut errors = Vec::new();
    let mut apply_all = async |children: Vec<(&Child, Desired)>, errors: &mut Vec<Error>| {
        let outcomes = futures::future::join_all(
            children
                .into_iter()
                .map(|(child, desired)| apply_child(ctx, mc, owner, child, desired, inputs)),
        )
        .await;
        for outcome in outcomes {
            match outcome {
                Ok((change, outcome)) => {
                    if let Some((reason, action, note)) = change {
                        changes.push(reason, action, note);
                    }
                    if let Some(outcome) = outcome {
                        applied.deployments.push(outcome.deployment);
                        applied.rollout_waiting = applied.rollout_waiting.or(outcome.waiting);
                    }
                }
                Err(e) => errors.push(e),
            }
        }
    };
    apply_all(mounted, &mut errors).await;
    if !errors.is_empty() {
        // The pool goes on; the proxy's pods wait for their configuration.
        wanted.retain(|(child, _)| child.role != PROXY_DEPLOYMENT);
    }
    apply_all(wanted, &mut errors).await;
    if errors.len() > 1 {
        return Err(Error::Children(errors));
    }
    if let Some(e) = errors.pop() {
        return Err(e);
    }
    for (child, name) in unwanted {
        delete::delete_child(ctx, changes, mc, owner, child, &name).await?;
    }
    Ok(applied)
}

/// A change to report in the reconcile's event: reason, action, note.
type Change = (&'static str, String, String);

/// Applies one child through the cache (or the fetch) of its kind.
async fn apply_child(
    ctx: &Context,
    mc: &Memcached,
    owner: &Owner,
    child: &Child,
    desired: Desired,
    inputs: &Inputs<'_>,
) -> Result<(Option<Change>, Option<ChildOutcome>), Error> {
    let apply = Apply {
        ctx,
        mc,
        owner,
        child,
        inputs,
    };
    match desired {
        Desired::Deployment(d) => {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let (applied, waiting) = match child.keep {
                Keep::PodHelpers => apply.run_pool(d).await?,
                Keep::Nothing => (apply.run(&ctx.deployments, d).await?, None),
            };
            let change = apply.report(&applied, Some(want));
            let live = match applied {
                Applied::Unchanged(live) => live,
                Applied::Created(after) | Applied::Updated { after, .. } => Arc::new(after),
            };
            Ok((
                change,
                Some(ChildOutcome {
                    deployment: (live.name_any(), live),
                    waiting,
                }),
            ))
        }
        Desired::Service(s) => {
            let applied = apply.run(&ctx.services, s).await?;
            Ok((apply.report(&applied, None), None))
        }
        Desired::PodDisruptionBudget(p) => {
            let applied = apply.run(&ctx.pdbs, p).await?;
            Ok((apply.report(&applied, None), None))
        }
        Desired::NetworkPolicy(p) => {
            let applied = apply.run(&ctx.network_policies, p).await?;
            Ok((apply.report(&applied, None), None))
        }
        Desired::HorizontalPodAutoscaler(h) => {
            let applied = apply.run(&ctx.hpas, h).await?;
            Ok((apply.report(&applied, None), None))
        }
        Desired::ConfigMap(c) => {
            let applied = apply.run(&ctx.config_maps, c).await?;
            Ok((apply.report(&applied, None), None))
        }
        Desired::ServiceMonitor(m) => {
            // Planned only while served (and so watched); gone since: nothing to apply.
            let Some(store) = ctx.service_monitors.store() else {
                return Ok((None, None));
            };
            let applied = apply.run(&Cache::of_store(store), m).await?;
            Ok((apply.report(&applied, None), None))
        }
    }
}

/// One child's apply.
struct Apply<'a> {
    ctx: &'a Context,
    mc: &'a Memcached,
    owner: &'a Owner,
    child: &'a Child,
    inputs: &'a Inputs<'a>,
}

/// A desired child with its hash, and the live child of that name.
struct Prepared<C: CacheForm> {
    desired: C::Full,
    /// `desired` as JSON (with its hash annotation), for the drift check.
    want: Option<Value>,
    hash: u64,
    name: String,
    namespace: String,
    /// The key its normal forms are filed under.
    key: u64,
    api: Api<C>,
    live: Option<Arc<C>>,
    /// Where the answer to the write is kept until the watch delivers it.
    cache: Cache<C>,
}

impl Apply<'_> {
    /// Applies `desired` unless the live child (read from `cache`) already holds it.
    async fn run<C: CacheForm>(
        &self,
        cache: &Cache<C>,
        desired: C::Full,
    ) -> Result<Applied<C>, Error> {
        let prepared = self.prepare(cache, desired).await?;
        if let Some(live) = &prepared.live
            && self.unchanged(&prepared, live).await
        {
            return Ok(Applied::Unchanged(live.clone()));
        }
        self.write(prepared).await
    }

    /// Hashes `desired` and reads the live child of its name: from `cache` (with our own
    /// writes its watch has not delivered yet), and for a child neither holds, from the API
    /// server (an object of that name may exist without our labels). Refuses a live child
    /// this Memcached does not control.
    async fn prepare<C: CacheForm>(
        &self,
        cache: &Cache<C>,
        desired: C::Full,
    ) -> Result<Prepared<C>, Error> {
        let name = desired.name_any();
        let namespace = desired.namespace().ok_or(Error::NoNamespace)?;
        let key = ObjectRef::new(&name).within(&namespace);
        // The answers are read straight into the cached form (only what the cache keeps).
        let api: Api<C> = Api::namespaced(self.ctx.client.clone(), &namespace);
        let mut live = cache.get(&key);
        if live.is_none() {
            // The cache holds only objects with our labels: before the first apply, look
            // for one of that name without them (another application's Service, say).
            live = api
                .get_opt(&name)
                .await
                .map_err(|e| self.error(&namespace, &name, e))?
                .map(Arc::new);
        }
        // Never take over an object this Memcached does not control: another pool's (a
        // field manager's apply would move the ownerReference and the selector from one
        // pool to the other on every reconcile), or one we did not create (an apply would
        // replace its selector, and our ownerReference would have it garbage-collected
        // with the Memcached). One exception: a child we created for an earlier Memcached
        // of this name, orphaned at its deletion, is taken back as it is (see `adopt`).
        if let Some(found) = live.clone().filter(|l| !self.owner.controls(l.as_ref())) {
            let object = format!("{namespace}/{name}");
            let kind = self.child.role;
            match self.owner.other_controller(found.as_ref()) {
                Some(controller) => {
                    return Err(Error::Conflict {
                        kind,
                        object,
                        controller,
                    });
                }
                None => {
                    // The cached forms keep no managedFields: read them from the server.
                    let meta = api
                        .get_metadata_opt(&name)
                        .await
                        .map_err(|e| self.error(&namespace, &name, e))?;
                    let instance = self.owner.object.name.as_str();
                    match meta {
                        // Gone since it was read: created afresh.
                        None => live = None,
                        Some(m) if adopt::ours_to_readopt(&m.metadata, instance) => {
                            info!(
                                object,
                                kind, "re-adopting an orphaned child this operator created"
                            );
                        }
                        Some(_) => return Err(Error::NotOurs { kind, object }),
                    }
                }
            }
        }
        Ok(self.with_live(desired, name, namespace, api, live, cache.clone()))
    }

    /// `desired`, hashed, against `live` (already read and checked).
    fn with_live<C: CacheForm>(
        &self,
        desired: C::Full,
        name: String,
        namespace: String,
        api: Api<C>,
        live: Option<Arc<C>>,
        cache: Cache<C>,
    ) -> Prepared<C> {
        let (desired, hash) = with_hash(desired);
        Prepared {
            want: serde_json::to_value(&desired).ok(),
            key: child_key(self.child.kind.name(), &name),
            desired,
            hash,
            name,
            namespace,
            api,
            live,
            cache,
        }
    }

    /// Whether `live` already holds what applying the prepared desired state would store
    /// (then this version of the child is remembered as converged with it).
    async fn unchanged<C: CacheForm>(&self, p: &Prepared<C>, live: &Arc<C>) -> bool {
        // This version of the child was compared with this desired state before: a resync
        // of a converged child costs one hash, not a JSON comparison.
        if live.verified().holds(p.hash) {
            return true;
        }
        self.ctx
            .config
            .counters
            .drift_checks
            .fetch_add(1, Ordering::Relaxed);
        let (Some(want), Some(have)) = (p.want.as_ref(), live.live_json()) else {
            return false;
        };
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let dry_run = || async {
            let stored = p
                .api
                .patch(&p.name, &params, &Patch::Apply(&p.desired))
                .await?;
            Ok(stored.live_json())
        };
        let converged = converged(self.ctx, self.owner, p.key, p.hash, want, &have, dry_run).await;
        if converged {
            live.verified().record(p.hash);
        }
        converged
    }

    /// Applies the prepared desired state.
    async fn write<C: CacheForm>(&self, p: Prepared<C>) -> Result<Applied<C>, Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let after = p
            .api
            .patch(&p.name, &params, &Patch::Apply(&p.desired))
            .await
            .map_err(|source| self.error(&p.namespace, &p.name, source))?;
        learn_from_answer(
            self.ctx,
            self.owner,
            p.key,
            p.hash,
            p.want.as_ref(),
            after.live_json(),
        );
        p.cache.wrote(after.clone());
        Ok(match p.live {
            None => Applied::Created(after),
            Some(before) => Applied::Updated { before, after },
        })
    }

    /// A failed read or write of the child `namespace/name`: [`Error::Refused`] on the
    /// Memcached's fields when the API server says the object is wrong, else
    /// [`Error::Apply`].
    fn error(&self, namespace: &str, name: &str, source: kube::Error) -> Error {
        let kind = self.child.role;
        if let kube::Error::Api(status) = &source
            && let Some(errors) = origins::refusal(self.child, self.mc, self.inputs, name, status)
        {
            return Error::Refused {
                kind,
                object: format!("{namespace}/{name}"),
                errors,
            };
        }
        Error::Apply {
            kind,
            object: format!("{namespace}/{name}"),
            source,
        }
    }

    /// Logs a created or updated child and says how the reconcile's event tells it;
    /// `want` is a Deployment's desired replicas.
    fn report<C: CacheForm>(&self, applied: &Applied<C>, want: Option<i32>) -> Option<Change> {
        let object = object_key(self.mc);
        let kind = self.child.kind.name();
        let (verb, child) = match applied {
            Applied::Unchanged(_) => return None,
            Applied::Created(after) => ("Created", after.name_any()),
            Applied::Updated { after, .. } => ("Updated", after.name_any()),
        };
        // Actions are imperative, as in `CreateDeployment`.
        let action = verb.trim_end_matches('d');
        if let (Report::Replicas, Some(want)) = (self.child.report, want) {
            return Some(match applied {
                Applied::Updated { before, .. } if before.replicas().unwrap_or(1) != want => {
                    let had = before.replicas().unwrap_or(1);
                    info!(object, from = had, to = want, "scaled {kind}");
                    (
                        "Scaled",
                        format!("Scale{kind}"),
                        format!("Scaled {kind} {child} from {had} to {want} replicas"),
                    )
                }
                Applied::Updated { .. } => {
                    info!(object, "updated {kind}");
                    (
                        "Updated",
                        format!("Update{kind}"),
                        format!("Updated {kind} {child} to the desired spec"),
                    )
                }
                _ => {
                    info!(object, replicas = want, "created {kind}");
                    (
                        "Created",
                        format!("Create{kind}"),
                        format!("Created {kind} {child} with {want} replicas"),
                    )
                }
            });
        }
        info!(object, kind, child, "{} {kind}", verb.to_lowercase());
        let note = match applied {
            Applied::Updated { .. } => format!("{verb} {kind} {child} to the desired spec"),
            _ => format!("{verb} {kind} {child}"),
        };
        Some((verb, format!("{action}{kind}"), note))
    }
}

/// `desired` with its hash annotation, and the hash.
fn with_hash<T: Resource + Serialize>(mut desired: T) -> (T, u64) {
    // The hash is computed without the annotation, then added, so it is stable.
    let hash = drift::desired_hash_value(&desired);
    desired
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            APPLIED_HASH_ANNOTATION.to_string(),
            drift::annotation_value(hash),
        );
    (desired, hash)
}

/// Whether `have` (the live child) holds what applying `want` (its desired state, hashed as
/// `hash`) would store, so that applying it would change nothing. The server decides what it
/// stores: the desired state's normal form is the one learned from the server's answer to
/// the last apply; when none was (after a restart), a desired state found verbatim in the
/// child needs none, and otherwise it is learned from `dry_run`, the server's answer to an
/// apply of `want` that stores nothing, but only when the child was last applied from this
/// same desired state (if not, it must be written anyway).
async fn converged<Fut>(
    ctx: &Context,
    owner: &Owner,
    child: u64,
    hash: u64,
    want: &Value,
    have: &Value,
    dry_run: impl FnOnce() -> Fut,
) -> bool
where
    Fut: Future<Output = Result<Option<Value>, kube::Error>>,
{
    if drift::is_converged(want, Some(have)) {
        return true;
    }
    if let Some(form) = ctx.normal_forms.get(owner.key, child, hash) {
        return form
            .of(want)
            .is_some_and(|normal| drift::is_converged(&normal, Some(have)));
    }
    if !drift::same_applied_hash(want, have) {
        return false;
    }
    match dry_run().await {
        Ok(Some(stored)) => {
            let form = NormalForm::learn(want, &stored);
            let normal = form.of(want);
            remember(ctx, owner, child, hash, form);
            normal.is_some_and(|normal| drift::is_converged(&normal, Some(have)))
        }
        Ok(None) => false,
        // A webhook with side effects refuses dry runs, for one: then the apply itself
        // tells (and is what a failure to reach the server is reported by).
        Err(e) => {
            debug!(error = %e, "dry-run apply failed; applying");
            false
        }
    }
}

/// Remembers the normal form of `child`'s desired state, unless its owner is gone or going
/// (its deletion may have been seen while this reconcile ran, and its forms forgotten).
fn remember(ctx: &Context, owner: &Owner, child: u64, hash: u64, form: NormalForm) {
    ctx.normal_forms.record(owner.key, child, hash, form);
    let gone = ctx
        .memcacheds
        .get(&owner.object)
        .is_none_or(|mc| mc.metadata.deletion_timestamp.is_some());
    if gone {
        ctx.normal_forms.forget_owner(owner.key);
    }
}

/// Learns the normal form of `want` from `stored`, the server's answer to applying it.
fn learn_from_answer(
    ctx: &Context,
    owner: &Owner,
    child: u64,
    hash: u64,
    want: Option<&Value>,
    stored: Option<Value>,
) {
    if let (Some(want), Some(stored)) = (want, stored) {
        remember(ctx, owner, child, hash, NormalForm::learn(want, &stored));
    }
}
