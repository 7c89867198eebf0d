//! The pool's Deployment through the apply path: on an operator upgrade it keeps the live
//! form of its pod helpers unless its template changes anyway, and a new default memcached
//! image waits for a fleet-wide rollout slot (see [`crate::controller::rollout`]).

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use serde_json::Value;

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
    /// (the second value: pools rolling now, of how many at once).
    pub(super) async fn run_pool(
        &self,
        new: Deployment,
    ) -> Result<(Applied<CachedDeployment>, Option<(usize, usize)>), Error> {
        let ctx = self.ctx;
        let fresh = self.prepare(&ctx.deployments, new.clone()).await?;
        let Some(live) = fresh.live.clone() else {
            return Ok((self.write(fresh).await?, None));
        };
        if self.unchanged(&fresh, &live).await {
            return Ok((Applied::Unchanged(live), None));
        }
        let live_json = live.live_json();
        let held = live_json
            .as_ref()
            .and_then(|l| l.get("spec"))
            .and_then(|spec| rollout::keep_live(self.mc, &new, spec, true));
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
        );
        let kept_unchanged = self.unchanged(&kept, &live).await;
        if !kept_unchanged && !self.keeps_template(&kept, live_json.as_ref()).await? {
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
        let waiting = image_moves.then(|| {
            (
                ctx.config.rollout_slots.rolling(&pool),
                ctx.config.rollout_slots.max(),
            )
        });
        if kept_unchanged {
            return Ok((Applied::Unchanged(live), waiting));
        }
        Ok((self.write(kept).await?, waiting))
    }

    /// Whether applying `kept` leaves the live pod template as it is, by the server's own
    /// answer to a dry run (it decides the defaults and the normal form of what it stores).
    async fn keeps_template(
        &self,
        kept: &Prepared<CachedDeployment>,
        live: Option<&Value>,
    ) -> Result<bool, Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let stored = kept
            .api
            .patch(&kept.name, &params, &Patch::Apply(&kept.desired))
            .await
            .map_err(|source| self.error(&kept.namespace, &kept.name, source))?;
        let stored = stored.live_json();
        Ok(stored.as_ref().and_then(rollout::template).is_some()
            && stored.as_ref().and_then(rollout::template) == live.and_then(rollout::template))
    }
}
