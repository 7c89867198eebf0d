//! What requests to the webhooks may hold at once, across connections: memory for their
//! bodies and what decoding them takes ([`MemoryBudget`]), and reviews dry-running their
//! children ([`MAX_DRY_RUNS_IN_FLIGHT`], kept by [`super::dry_run::ChildrenCheck`]). A request
//! beyond either bound is answered 429 with `Retry-After` at once instead of waiting.
//!
//! Why 429 and not a queue: the API server's webhook client retries a 429 after its
//! `Retry-After` (up to 10 times within the webhook's 10 s timeout), so a burst of genuine
//! writes is admitted a second later, while a flood gets nothing held for it.

use std::sync::{Arc, Mutex, MutexGuard};

/// Memory all requests may hold at once: their bodies as they are read, then what decoding
/// them takes (see [`HELD_PER_BODY_BYTE`]). 32 MiB: the manager's memory limit is 128 MiB,
/// the operator takes 12 MiB idle and 34 MiB with 1,000 Memcacheds cached (BENCHMARKS.md),
/// and under the flood of `tests/webhook_flood.rs` (256 connections busy, this budget in
/// use) it peaks 15–26 MiB above idle.
pub const MEMORY_BUDGET_BYTES: usize = 32 * 1024 * 1024;
/// Requests holding more than this are large. A Memcached's review is a few KiB of JSON
/// and holds some 50 KiB with its decoded forms (`tests/decode_cost.rs`).
pub const SMALL_REQUEST_BYTES: usize = 256 * 1024;
/// Large requests share at most this part of [`MEMORY_BUDGET_BYTES`], so that a flood of
/// large bodies leaves the other half to reviews of ordinary size.
pub const LARGE_REQUESTS_BYTES: usize = 16 * 1024 * 1024;
/// The most one request may hold (413 beyond): its body and its decoded forms. A review of
/// an ordinary 1 MiB body holds 4 MiB; only JSON of tiny values packed densely needs more.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// What a request holds per byte of body before it is decoded (the decoded size is known
/// only once the body is in; [`super::decode::decoded_size`] then sets it): the byte
/// itself, and three for its decoded forms in ordinary JSON (the `serde_json` tree, the
/// typed Memcached decoded from it, the defaulted copy the mutating webhook compares).
pub const HELD_PER_BODY_BYTE: usize = 4;
/// Reviews whose children are being dry-run at once. Each is 4–9 server-side applies
/// under the operator's identity, which the API server's fairness queues share with the
/// reconciler's own writes; 4 reviews are 36 requests at most, and a check takes about
/// 15 ms, so 4 at once admit some 250 Memcacheds a second.
pub const MAX_DRY_RUNS_IN_FLIGHT: usize = 4;
/// What a 429 asks the client to wait, in seconds (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The bytes requests hold, shared by every connection of a server.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    used: Arc<Mutex<Used>>,
    total: usize,
    large: usize,
}

#[derive(Debug, Default)]
struct Used {
    all: usize,
    large: usize,
}

/// Why a request cannot hold what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// More than one request may ever hold ([`MAX_REQUEST_BYTES`]): 413.
    TooLarge { wanted: usize },
    /// Not now (429, retry): requests in progress hold `held` of the `limit` that all
    /// requests, or large ones (`large`), may hold.
    Busy {
        wanted: usize,
        held: usize,
        limit: usize,
        large: bool,
    },
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::new(MEMORY_BUDGET_BYTES, LARGE_REQUESTS_BYTES)
    }
}

impl MemoryBudget {
    /// A budget of `total` bytes, of which large requests may hold `large`.
    pub fn new(total: usize, large: usize) -> Self {
        Self {
            used: Arc::new(Mutex::new(Used::default())),
            total,
            large: large.min(total),
        }
    }

    fn used(&self) -> MutexGuard<'_, Used> {
        // The counters stay consistent even if a holder panicked mid-update: every update
        // is one assignment of both.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes held now by all requests.
    pub fn held(&self) -> usize {
        self.used().all
    }

    /// Holds `bytes` for one request, until the [`Held`] is dropped.
    pub fn hold(&self, bytes: usize) -> Result<Held, Refusal> {
        let mut held = Held {
            budget: self.clone(),
            bytes: 0,
        };
        held.resize(bytes)?;
        Ok(held)
    }
}

/// What one request holds of a [`MemoryBudget`]; given back on drop.
#[derive(Debug)]
pub struct Held {
    budget: MemoryBudget,
    bytes: usize,
}

impl Held {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` instead: less always succeeds; more only within
    /// [`MAX_REQUEST_BYTES`] (else [`Refusal::TooLarge`]) and while the budget has room
    /// (else [`Refusal::Busy`], and what was held stays held).
    pub fn resize(&mut self, bytes: usize) -> Result<(), Refusal> {
        if bytes > MAX_REQUEST_BYTES {
            return Err(Refusal::TooLarge { wanted: bytes });
        }
        let large_part = |b: usize| if b > SMALL_REQUEST_BYTES { b } else { 0 };
        let budget = &self.budget;
        let mut used = budget.used();
        let all = used.all - self.bytes + bytes;
        let large = used.large - large_part(self.bytes) + large_part(bytes);
        if bytes > self.bytes {
            if all > budget.total {
                return Err(Refusal::Busy {
                    wanted: bytes,
                    held: used.all,
                    limit: budget.total,
                    large: false,
                });
            }
            if large_part(bytes) > 0 && large > budget.large {
                return Err(Refusal::Busy {
                    wanted: bytes,
                    held: used.large,
                    limit: budget.large,
                    large: true,
                });
            }
        }
        *used = Used { all, large };
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.resize(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    /// Large requests fill their share and no more; small ones still find room, up to the
    /// whole budget; what is dropped is given back.
    #[test]
    fn large_requests_leave_room_for_small_ones() {
        let budget = MemoryBudget::default();
        let large: Vec<Held> = (0..4)
            .map(|_| budget.hold(4 * MIB).expect("room"))
            .collect();
        assert_eq!(budget.held(), 16 * MIB);
        assert!(matches!(
            budget.hold(4 * MIB),
            Err(Refusal::Busy { limit, large: true, .. }) if limit == LARGE_REQUESTS_BYTES
        ));
        let small: Vec<Held> = (0..64)
            .map(|_| {
                budget
                    .hold(SMALL_REQUEST_BYTES)
                    .expect("room for small requests")
            })
            .collect();
        assert_eq!(budget.held(), MEMORY_BUDGET_BYTES);
        assert!(matches!(
            budget.hold(1),
            Err(Refusal::Busy { limit, large: false, .. }) if limit == MEMORY_BUDGET_BYTES
        ));
        drop(large);
        drop(small);
        assert_eq!(budget.held(), 0);
        assert!(budget.hold(4 * MIB).is_ok());
    }

    /// A request grows from small to large and back; a refused growth keeps what it held;
    /// more than one request may hold is refused as too large, not busy.
    #[test]
    fn a_request_resizes_within_its_bounds() {
        let budget = MemoryBudget::new(10 * MIB, 5 * MIB);
        let mut other = budget.hold(4 * MIB).expect("room");
        let mut held = budget.hold(1024).expect("room");
        assert!(matches!(held.resize(2 * MIB), Err(Refusal::Busy { .. })));
        assert_eq!((held.bytes(), budget.held()), (1024, 4 * MIB + 1024));
        other.resize(MIB).expect("shrinking always succeeds");
        held.resize(2 * MIB).expect("room now");
        held.resize(1024).expect("shrinking");
        assert_eq!(budget.held(), MIB + 1024);
        assert_eq!(
            held.resize(MAX_REQUEST_BYTES + 1),
            Err(Refusal::TooLarge {
                wanted: MAX_REQUEST_BYTES + 1
            })
        );
        drop((held, other));
        assert_eq!(budget.held(), 0);
    }
}
