//! The answers of the two webhooks: defaulting (the CRD schema's defaults as a JSON
//! patch), validation (denials in kube-apiserver's shape, warnings) and, for the
//! validating webhook, the dry run of the children through [`crate::webhook::dry_run`]
//! (a 429 when as many dry runs as may run at once are running).

use axum::http::StatusCode;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use memcached_api::validation::{self, ValidationErrors};
use memcached_api::{GROUP, VERSION};
use serde_json::Value;

use super::decode::{BadRequest, DecodedReview, decode_body, decode_memcached};
use super::dry_run::{ChildrenCheck, FailurePolicy, Verdict};
use super::limits::RETRY_AFTER_SECONDS;
use super::schema::apply_schema_defaults;

/// Which webhook a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Defaulting.
    Mutate,
    /// Validation.
    Validate,
}

/// Everything a webhook does with one request body: decode, then default or validate.
/// `Err` is a request that is not a usable AdmissionReview (HTTP 400/413).
pub fn handle(
    endpoint: Endpoint,
    body: &[u8],
    default_image: &str,
) -> Result<AdmissionReview<DynamicObject>, BadRequest> {
    let review = decode_body(body)?;
    let response = match endpoint {
        Endpoint::Mutate => mutate(&review),
        Endpoint::Validate => validate(&review, default_image),
    };
    Ok(answer(&review, endpoint, response))
}

/// [`handle`], and for an object the validating webhook admits, the dry run of its
/// children through `children` (see [`crate::webhook::dry_run`]); `Err` 429 when as many
/// dry runs as may run at once are running.
pub async fn handle_checked(
    endpoint: Endpoint,
    body: &[u8],
    default_image: &str,
    children: Option<&ChildrenCheck>,
) -> Result<AdmissionReview<DynamicObject>, BadRequest> {
    let review = decode_body(body)?;
    let response = match endpoint {
        Endpoint::Mutate => mutate(&review),
        Endpoint::Validate => {
            let response = validate(&review, default_image);
            match children {
                Some(check) if response.allowed => check_children(&review, response, check).await?,
                _ => response,
            }
        }
    };
    Ok(answer(&review, endpoint, response))
}

/// The validating webhook's answer `response` (an admission) amended by the dry run of the
/// object's children: refused with the Memcached's field paths when the API server would
/// refuse a child, and when the check cannot be done, refused or admitted with a warning
/// as the check's failure policy says. Not checked: requests the webhook does not look
/// at, objects being deleted, and updates that leave the spec as it was. `Err` (429) when
/// the check was not started because as many as may run at once were running.
async fn check_children(
    review: &DecodedReview,
    mut response: AdmissionResponse,
    check: &ChildrenCheck,
) -> Result<AdmissionResponse, BadRequest> {
    let req = &review.request;
    if !matches!(check_target(req), Ok(true)) {
        return Ok(response);
    }
    let Some(object) = review.object.as_ref() else {
        return Ok(response);
    };
    let Ok(mut mc) = decode_memcached(object) else {
        return Ok(response);
    };
    if mc.metadata.deletion_timestamp.is_some() {
        return Ok(response);
    }
    if req.operation == Operation::Update
        && let Some(Ok(old)) = review.old_object.as_ref().map(decode_memcached)
        && old.spec == mc.spec
    {
        return Ok(response);
    }
    let mut name = object_name(req, object);
    if name.is_empty() {
        // Only a create with generateName whose name is not generated yet: any name of the
        // same length is checked the same way.
        name = format!(
            "{}{}",
            mc.metadata.generate_name.as_deref().unwrap_or("memcached-"),
            "0".repeat(validation::GENERATED_SUFFIX_LENGTH)
        );
    }
    mc.metadata.name = Some(name.clone());
    if mc
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        mc.metadata.namespace = req.namespace.clone();
    }
    Ok(match check.check(&mc).await {
        Verdict::Accepted => response,
        Verdict::Refused(errors) => deny_invalid(req, &name, &errors),
        Verdict::Busy => {
            return Err(BadRequest {
                uid: req.uid.clone(),
                ..BadRequest::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "the webhook is busy: it is checking the children of {} Memcacheds with the API server already, as many as it checks at once; retry in {RETRY_AFTER_SECONDS} s",
                        check.max_in_flight()
                    ),
                )
            });
        }
        Verdict::Unchecked(why) => match check.policy() {
            FailurePolicy::Fail => {
                let message = format!(
                    "the children of Memcached {name:?} could not be checked with the API server, so it was not admitted; retry: {why}"
                );
                tracing::warn!(%name, namespace = req.namespace.as_deref().unwrap_or(""), reason = %why, "refused a Memcached whose children could not be checked");
                response.allowed = false;
                response.result = Status::failure(&message, "ServiceUnavailable").with_code(503);
                response
            }
            FailurePolicy::Ignore => {
                tracing::warn!(%name, namespace = req.namespace.as_deref().unwrap_or(""), reason = %why, "admitted a Memcached whose children could not be checked");
                response.warnings.get_or_insert_with(Vec::new).push(format!(
                    "the Deployment and Services of {name:?} were not checked with the API server ({why}); if Kubernetes refuses them, the Memcached's Degraded condition will say why"
                ));
                response
            }
        },
    })
}

fn answer(
    review: &DecodedReview,
    endpoint: Endpoint,
    response: AdmissionResponse,
) -> AdmissionReview<DynamicObject> {
    tracing::debug!(
        uid = %review.request.uid,
        operation = ?review.request.operation,
        namespace = review.request.namespace.as_deref().unwrap_or(""),
        name = %review.request.name,
        ?endpoint,
        allowed = response.allowed,
        "admission review"
    );
    response.into_review()
}

/// Whether the request is about what this webhook admits, else the denial.
fn check_target(req: &AdmissionRequest<DynamicObject>) -> Result<bool, String> {
    let kind = &req.kind;
    if kind.group != GROUP || kind.version != VERSION || kind.kind != "Memcached" {
        return Err(format!(
            "this webhook admits {GROUP}/{VERSION} Memcached, not {}/{} {}: check the rules of the webhook configuration",
            kind.group, kind.version, kind.kind
        ));
    }
    if req.resource.resource != "memcacheds" {
        return Err(format!(
            "this webhook admits the resource memcacheds, not {:?}: check the rules of the webhook configuration",
            req.resource.resource
        ));
    }
    // Subresources (status, scale) are not registered; DELETE and CONNECT carry nothing
    // to default or validate.
    let relevant = req.sub_resource.as_deref().unwrap_or("").is_empty()
        && matches!(req.operation, Operation::Create | Operation::Update);
    Ok(relevant)
}

/// The object both webhooks look at, or the answer when there is nothing to look at: a
/// request for another resource is denied, a subresource or DELETE is allowed unchanged,
/// and a missing object is denied.
fn object_to_review(review: &DecodedReview) -> Result<&Value, Box<AdmissionResponse>> {
    let req = &review.request;
    match check_target(req) {
        Err(message) => return Err(Box::new(deny_request(req, message))),
        Ok(false) => return Err(Box::new(AdmissionResponse::from(req))),
        Ok(true) => {}
    }
    review.object.as_ref().ok_or_else(|| {
        Box::new(deny_request(
            req,
            format!("request.object is required for {:?}", req.operation),
        ))
    })
}

/// The defaulting webhook: the CRD schema's defaults as a JSON patch.
pub fn mutate(review: &DecodedReview) -> AdmissionResponse {
    let req = &review.request;
    let object = match object_to_review(review) {
        Ok(object) => object,
        Err(answer) => return *answer,
    };
    // Only what can be understood is defaulted; structural problems are answered here
    // (mutating webhooks run first) with the same field errors the validator gives.
    if let Err(errors) = decode_memcached(object) {
        return deny_invalid(req, &object_name(req, object), &errors);
    }
    let mut defaulted = object.clone();
    apply_schema_defaults(&mut defaulted);
    let patch = json_patch::diff(object, &defaulted);
    if patch.0.is_empty() {
        return AdmissionResponse::from(req);
    }
    match AdmissionResponse::from(req).with_patch(patch) {
        Ok(response) => response,
        Err(e) => deny_request(req, format!("cannot encode the defaulting patch: {e}")),
    }
}

/// The validating webhook.
pub fn validate(review: &DecodedReview, default_image: &str) -> AdmissionResponse {
    let req = &review.request;
    let object = match object_to_review(review) {
        Ok(object) => object,
        Err(answer) => return *answer,
    };
    let name = object_name(req, object);
    let mut mc = match decode_memcached(object) {
        Ok(mc) => mc,
        Err(errors) => return deny_invalid(req, &name, &errors),
    };
    if mc.metadata.name.as_deref().unwrap_or_default().is_empty() && !req.name.is_empty() {
        mc.metadata.name = Some(req.name.clone());
    }
    let (result, warnings) = match req.operation {
        Operation::Update => {
            if mc.metadata.deletion_timestamp.is_some() {
                // Never block the last updates of an object being deleted (finalizers).
                return AdmissionResponse::from(req);
            }
            match review.old_object.as_ref().map(decode_memcached) {
                Some(Ok(old)) => (
                    validation::validate_update(&old, &mc),
                    validation::update_warnings(&old, &mc, default_image),
                ),
                _ => (
                    validation::validate(&mc),
                    validation::warnings(&mc, default_image),
                ),
            }
        }
        _ => (
            validation::validate(&mc),
            validation::warnings(&mc, default_image),
        ),
    };
    if let Err(errors) = result {
        return deny_invalid(req, &name, &errors);
    }
    let mut response = AdmissionResponse::from(req);
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

fn object_name(req: &AdmissionRequest<DynamicObject>, object: &Value) -> String {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(&req.name)
        .to_string()
}

fn deny_request(req: &AdmissionRequest<DynamicObject>, message: String) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req);
    response.allowed = false;
    response.result = Status::failure(&message, "BadRequest").with_code(400);
    response
}

/// A denial in the shape kube-apiserver gives an invalid object: code 422, reason
/// Invalid, `Memcached.memcached.cache.example.com "<name>" is invalid: <field errors>`,
/// and one cause per field.
fn deny_invalid(
    req: &AdmissionRequest<DynamicObject>,
    name: &str,
    errors: &ValidationErrors,
) -> AdmissionResponse {
    let list: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
    let joined = match list.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let message = format!("Memcached.{GROUP} {name:?} is invalid: {joined}");
    let causes = errors
        .0
        .iter()
        .map(|e| StatusCause {
            reason: e.reason().to_string(),
            message: e.message.clone(),
            field: e.field.clone(),
        })
        .collect();
    let details = StatusDetails {
        name: name.to_string(),
        group: GROUP.to_string(),
        kind: "Memcached".to_string(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    };
    let mut response = AdmissionResponse::from(req);
    response.allowed = false;
    response.result = Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(details);
    response
}
