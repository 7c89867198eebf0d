//! Deleting a child a Memcached no longer wants: only one it controls, only the version the
//! cache holds (a uid precondition), and the normal forms learned of it forgotten.

use kube::api::DeleteParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use memcached_api::Memcached;
use tracing::info;

use super::super::context::{Context, Error, object_key};
use super::super::events::Changes;
use super::{Owner, child_key};
use crate::cached::CacheForm;
use crate::children::{Child, Kind};
use crate::informer::Cache;

/// Deletes the child `name` of `child`'s kind if it is there and this Memcached controls
/// it, through the cache (or the fetch) of its kind.
pub(super) async fn delete_child(
    ctx: &Context,
    changes: &mut Changes,
    mc: &Memcached,
    owner: &Owner,
    child: &Child,
    name: &str,
) -> Result<(), Error> {
    let delete = Delete {
        ctx,
        mc,
        owner,
        name,
    };
    let deleted = match child.kind {
        Kind::Deployment => delete.run(&ctx.deployments).await,
        Kind::Service => delete.run(&ctx.services).await,
        Kind::PodDisruptionBudget => delete.run(&ctx.pdbs).await,
        Kind::NetworkPolicy => delete.run(&ctx.network_policies).await,
        Kind::HorizontalPodAutoscaler => delete.run(&ctx.hpas).await,
        Kind::ConfigMap => delete.run(&ctx.config_maps).await,
        Kind::ServiceMonitor => match ctx.service_monitors.store() {
            Some(store) => delete.run(&Cache::of_store(store)).await,
            None => Ok(false),
        },
    }?;
    if deleted {
        let kind = child.kind.name();
        changes.push(
            "Deleted",
            format!("Delete{kind}"),
            format!("Deleted {kind} {name}: no longer needed"),
        );
    }
    Ok(())
}

/// One child's deletion.
struct Delete<'a> {
    ctx: &'a Context,
    mc: &'a Memcached,
    owner: &'a Owner,
    name: &'a str,
}

impl Delete<'_> {
    /// Deletes the child if `cache` has it and it is ours; whether it did.
    async fn run<C: CacheForm>(&self, cache: &Cache<C>) -> Result<bool, Error> {
        let (ctx, name) = (self.ctx, self.name);
        let namespace = self.mc.namespace().ok_or(Error::NoNamespace)?;
        let kind = C::kind(&()).into_owned();
        let error = |source| Error::Delete {
            kind: kind.clone(),
            object: format!("{namespace}/{name}"),
            source,
        };
        let Some(live) = cache.get(&ObjectRef::new(name).within(&namespace)) else {
            return Ok(false);
        };
        // Only ours, and only the version we saw: not another pool's object of the same
        // name, nor one recreated meanwhile.
        if !self.owner.controls(live.as_ref()) {
            return Ok(false);
        }
        ctx.normal_forms
            .forget_child(self.owner.key, child_key(&kind, name));
        let params = DeleteParams {
            preconditions: live.meta().uid.clone().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let api: Api<C::Full> = Api::namespaced(ctx.client.clone(), &namespace);
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(object = %object_key(self.mc), kind, name, "deleted");
                Ok(true)
            }
            // Gone already, or replaced by another object of that name since we saw it (the
            // uid precondition failed): the next reconcile sees what is there now.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
            Err(source) => Err(error(source)),
        }
    }
}
