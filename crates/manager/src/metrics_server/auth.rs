//! Who may scrape `/metrics`: bearer tokens checked with TokenReview, access with
//! SubjectAccessReview, decisions cached per (token, verb, path), and what unknown tokens
//! may cost the API server bounded (rate, concurrency, timeout).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// How long an authentication/authorization decision is reused for the same token.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(10);
/// At most this many cached decisions are kept.
const AUTH_CACHE_MAX: usize = 1024;

/// The authenticated caller (from a TokenReview).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name, e.g. `system:serviceaccount:monitoring:prometheus`.
    pub username: String,
    /// UID.
    pub uid: Option<String>,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// A review call that failed (answered with 500, never cached).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The TokenReview call failed.
    #[error("creating TokenReview: {0}")]
    TokenReview(#[source] kube::Error),
    /// The SubjectAccessReview call failed.
    #[error("creating SubjectAccessReview: {0}")]
    SubjectAccessReview(#[source] kube::Error),
    /// Any other failure (fakes, future implementations).
    #[error("{0}")]
    Other(String),
}

/// Authentication and authorization of scrapers, behind a trait so the server is
/// testable without a cluster. [`KubeAuthorizer`] is the real one.
pub trait Authorizer: Send + Sync + 'static {
    /// `Ok(None)` when the token is not valid.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, AuthError>>;
    /// Whether `user` may do `verb` on the non-resource URL `path`.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>>;
}

/// Checks tokens with `TokenReview` and access with `SubjectAccessReview` (needs RBAC:
/// `create` on `tokenreviews` and `subjectaccessreviews`, as kube-rbac-proxy does).
#[derive(Clone)]
pub struct KubeAuthorizer {
    client: kube::Client,
}

impl KubeAuthorizer {
    /// Uses `client` for the reviews.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Authorizer for KubeAuthorizer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, AuthError>> {
        Box::pin(async move {
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: None,
                },
                ..Default::default()
            };
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(AuthError::TokenReview)?;
            let Some(status) = out.status else {
                return Ok(None);
            };
            if status.authenticated != Some(true) {
                return Ok(None);
            }
            let user = status.user.unwrap_or_default();
            Ok(Some(UserInfo {
                username: user.username.unwrap_or_default(),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.username.clone()),
                    uid: user.uid.clone(),
                    groups: Some(user.groups.clone()),
                    extra: Some(user.extra.clone()),
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(path.to_string()),
                        verb: Some(verb.to_string()),
                    }),
                    resource_attributes: None,
                },
                ..Default::default()
            };
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(AuthError::SubjectAccessReview)?;
            Ok(out.status.map(|s| s.allowed).unwrap_or(false))
        })
    }
}

/// Outcome of checking one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// 200.
    Allowed,
    /// No or invalid token: 401.
    Unauthenticated,
    /// Valid token, access denied: 403.
    Forbidden(String),
}

/// How much checking scrapers may cost the API server. Bearer tokens nobody has seen
/// authenticated are the cost an anonymous client can make at will, so their reviews are
/// rate-limited and limited in number at once; tokens the API server authenticated before
/// are reviewed again once per `ttl` without those limits, so a flood of junk cannot lock
/// out a real scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewLimits {
    /// How long a decision (allowed, denied, or an unknown token) is reused.
    pub ttl: Duration,
    /// Reviews of unknown tokens that may be made in a burst ...
    pub burst: u32,
    /// ... and one more each `refill` after it (a token bucket).
    pub refill: Duration,
    /// At most this many reviews of unknown tokens in flight at once.
    pub concurrent: usize,
    /// Each TokenReview and SubjectAccessReview call is abandoned after this long (the
    /// scraper is answered 503).
    pub timeout: Duration,
}

/// At most 20 reviews of unknown tokens at once, 10 a second after that, 4 in flight, each
/// call abandoned after 10 s (the API server's own delegated authentication's timeout).
impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            ttl: AUTH_CACHE_TTL,
            burst: 20,
            refill: Duration::from_millis(100),
            concurrent: 4,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why no decision was reached (never cached).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The review budget for unknown tokens is spent: 429, try again after `retry_after`.
    #[error("too many requests with unknown tokens; retry after {retry_after:?}")]
    Busy {
        /// When the budget allows another review.
        retry_after: Duration,
    },
    /// A review call took longer than [`ReviewLimits::timeout`]: 503.
    #[error("the API server did not answer a review within {0:?}")]
    Timeout(Duration),
    /// A review call failed: 500.
    #[error(transparent)]
    Review(#[from] AuthError),
}

/// SHA-256 of a bearer token: what the caches keep instead of the token (32 bytes each
/// whatever its size, and no credential in memory longer than its request).
type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    out
}

/// (token, verb, path).
type CacheKey = (TokenDigest, String, String);

/// Decisions kept apart by kind, so junk cannot evict real decisions: `known` holds only
/// tokens the API server authenticated (allowed or denied), `rejected` the tokens it did
/// not. Each keeps at most 1024 entries, dropping expired ones first and
/// then the oldest. An expired `known` entry still marks its token as known.
#[derive(Default)]
struct Caches {
    known: HashMap<CacheKey, (Instant, Decision)>,
    rejected: HashMap<TokenDigest, Instant>,
}

fn make_room<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    at: impl Fn(&V) -> Instant,
    ttl: Duration,
) {
    if map.len() < AUTH_CACHE_MAX {
        return;
    }
    map.retain(|_, v| at(v).elapsed() < ttl);
    while map.len() >= AUTH_CACHE_MAX {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| at(v))
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        map.remove(&oldest);
    }
}

/// Caches decisions per (token, verb, path) for a TTL and bounds what unknown tokens
/// cost (see [`ReviewLimits`]).
pub struct CachingAuthorizer {
    inner: Arc<dyn Authorizer>,
    limits: ReviewLimits,
    cache: Mutex<Caches>,
    budget: governor::DefaultDirectRateLimiter,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl CachingAuthorizer {
    /// Wraps `inner`, reusing decisions for `ttl`, with the default [`ReviewLimits`].
    pub fn new(inner: Arc<dyn Authorizer>, ttl: Duration) -> Self {
        Self::with_limits(
            inner,
            ReviewLimits {
                ttl,
                ..ReviewLimits::default()
            },
        )
    }

    /// Wraps `inner` with `limits` (a zero burst, refill or concurrency counts as one, a
    /// zero refill as one nanosecond).
    pub fn with_limits(inner: Arc<dyn Authorizer>, limits: ReviewLimits) -> Self {
        let burst = std::num::NonZeroU32::new(limits.burst).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = governor::Quota::with_period(limits.refill)
            .unwrap_or_else(|| governor::Quota::per_second(std::num::NonZeroU32::MAX))
            .allow_burst(burst);
        Self {
            inner,
            limits,
            cache: Mutex::new(Caches::default()),
            budget: governor::RateLimiter::direct(quota),
            in_flight: Arc::new(tokio::sync::Semaphore::new(limits.concurrent.max(1))),
        }
    }

    /// Decides for a bearer `token` doing `verb` on `path`.
    pub async fn check(&self, token: &str, verb: &str, path: &str) -> Result<Decision, CheckError> {
        let token_digest = digest(token);
        let key = (token_digest, verb.to_string(), path.to_string());
        let ttl = self.limits.ttl;
        let known = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, d)) = cache.known.get(&key) {
                if at.elapsed() < ttl {
                    return Ok(d.clone());
                }
                true
            } else {
                if cache
                    .rejected
                    .get(&token_digest)
                    .is_some_and(|at| at.elapsed() < ttl)
                {
                    return Ok(Decision::Unauthenticated);
                }
                false
            }
        };
        // Only unknown tokens spend the budget; a permit is held for their whole review.
        let _permit = if known {
            None
        } else {
            let permit =
                self.in_flight
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| CheckError::Busy {
                        retry_after: Duration::from_secs(1),
                    })?;
            if let Err(not_until) = self.budget.check() {
                use governor::clock::{Clock, DefaultClock};
                return Err(CheckError::Busy {
                    retry_after: not_until.wait_time_from(DefaultClock::default().now()),
                });
            }
            Some(permit)
        };
        let timeout = self.limits.timeout;
        let decision = match bounded(timeout, self.inner.authenticate(token)).await? {
            None => Decision::Unauthenticated,
            Some(user) => {
                if bounded(timeout, self.inner.authorize(&user, verb, path)).await? {
                    Decision::Allowed
                } else {
                    Decision::Forbidden(user.username)
                }
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if decision == Decision::Unauthenticated {
            // A token no longer valid is no longer known.
            cache.known.retain(|(t, _, _), _| *t != token_digest);
            make_room(&mut cache.rejected, |at| *at, ttl);
            cache.rejected.insert(token_digest, Instant::now());
        } else {
            cache.rejected.remove(&token_digest);
            make_room(&mut cache.known, |(at, _)| *at, ttl);
            cache.known.insert(key, (Instant::now(), decision.clone()));
        }
        Ok(decision)
    }
}

/// `review`, abandoned after `timeout`.
async fn bounded<T>(
    timeout: Duration,
    review: BoxFuture<'_, Result<T, AuthError>>,
) -> Result<T, CheckError> {
    tokio::time::timeout(timeout, review)
        .await
        .map_err(|_| CheckError::Timeout(timeout))?
        .map_err(CheckError::Review)
}
