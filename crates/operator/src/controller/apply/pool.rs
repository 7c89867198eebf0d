//! The pool's Deployment through the apply path: on an operator upgrade it keeps the live
//! form of its pod helpers unless its template changes anyway, and a new default memcached
//! image waits for a fleet-wide rollout slot (see [`crate::controller::rollout`]).

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use tracing::debug;

use super::super::context::Error;
use super::super::rollout;
use super::{Applied, Apply, Prepared};
use crate::builders::FIELD_MANAGER;
use crate::cached::{CacheForm, CachedDeployment};

impl Apply<'_> {
    /// The pool's Deployment, which keeps the live form of its pod helpers on an operator
    /// upgrade ([`rollout::keep_live`]): `new` is applied when the pod template changes
    /// anyway (for the pool's own reasons), else the template is left as it is; a new
    /// default memcached image rolls when a fleet-wide slot is free, and otherwise waits
    /// (the second value: how many pools may roll at once).
    pub(super) async fn run_pool(
        &self,
        new: Deployment,
    ) -> Result<(Applied<CachedDeployment>, Option<usize>), Error> {
        let ctx = self.ctx;
        let fresh = self.prepare(&ctx.deployments, new.clone()).await?;
        let Some(live) = fresh.live.clone() else {
            return Ok((self.write(fresh).await?, None));
        };
        if self.unchanged(&fresh, &live).await {
            return Ok((Applied::Unchanged(live), None));
        }
        let live_json = live.live_json();
        // Any pod available (or none wanted): what runs, runs (see `rollout::keep_live`).
        let serving = live.replicas() == Some(0)
            || live
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0)
                > 0;
        let held = live_json
            .as_ref()
            .and_then(|l| l.get("spec"))
            .and_then(|spec| rollout::keep_live(self.mc, &new, spec, true, serving));
        let Some(held) = held else {
            return Ok((self.write(fresh).await?, None));
        };
        let image_moves = rollout::memcached_image(&held) != rollout::memcached_image(&new);
        let kept = self.with_live(
            held,
            fresh.name.clone(),
            fresh.namespace.clone(),
            fresh.api.clone(),
            Some(live.clone()),
            fresh.cache.clone(),
        );
        let kept_unchanged = self.unchanged(&kept, &live).await;
        if !kept_unchanged && !self.keeps_template(&kept, live_json.as_ref()).await {
            // The template changes for the pool's own reasons: everything new, in one go.
            return Ok((self.write(fresh).await?, None));
        }
        let pool = self.owner.object.clone();
        if image_moves {
            if ctx.config.rollout_slots.try_take(&pool) {
                let applied = match self.write(fresh).await {
                    Ok(applied) => applied,
                    Err(e) => {
                        ctx.config.rollout_slots.give_back(&pool);
                        return Err(e);
                    }
                };
                let generation = match &applied {
                    Applied::Updated { after, .. } | Applied::Created(after) => {
                        after.metadata.generation.unwrap_or(0)
                    }
                    Applied::Unchanged(live) => live.metadata.generation.unwrap_or(0),
                };
                ctx.config.rollout_slots.started(pool, generation);
                return Ok((applied, None));
            }
        } else if kept_unchanged {
            // Only the helpers would move: this version of the Deployment is as wanted.
            live.verified().record(fresh.hash);
        }
        let waiting = image_moves.then(|| ctx.config.rollout_slots.max());
        if kept_unchanged {
            return Ok((Applied::Unchanged(live), waiting));
        }
        Ok((self.write(kept).await?, waiting))
    }

    /// Whether applying `kept` leaves the live pod template exactly as it is, by the
    /// server's own answer to a dry run (it decides the defaults and the normal form of what
    /// it stores), and the kept parts are the operator's own: a field of them that another
    /// field manager holds (`kubectl set image` of the exporter, say) is drift to repair,
    /// not a part to keep. A dry run that fails (a webhook that supports none) says no: the
    /// new template is applied, as it would be without this path.
    async fn keeps_template(
        &self,
        kept: &Prepared<CachedDeployment>,
        live: Option<&Value>,
    ) -> bool {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.ctx.client.clone(),
            &kept.namespace,
            &ApiResource::erase::<Deployment>(&()),
        );
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let stored = match api
            .patch(&kept.name, &params, &Patch::Apply(&kept.desired))
            .await
        {
            Ok(stored) => stored,
            Err(e) => {
                debug!(error = %e, "dry run of the kept template failed; applying the new one");
                return false;
            }
        };
        let template = stored.data.pointer("/spec/template");
        template.is_some()
            && template == live.and_then(rollout::template)
            && !rollout::edited_by_others(stored.metadata.managed_fields.as_deref(), FIELD_MANAGER)
    }
}
