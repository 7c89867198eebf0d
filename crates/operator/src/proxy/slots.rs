//! Which pod of the pool holds which slot of the proxy's rings: the membership rules, the
//! deletion cost each member carries so a scale-down removes the last slots, and the rings
//! as recorded in the ConfigMap ([`BACKENDS_KEY`]), read back after a restart.

use std::collections::{BTreeMap, BTreeSet};

use memcached_api::{GrownFrom, ProxyBackend, WarmFrom};
use serde::Deserialize;

use super::BACKENDS_KEY;

/// The annotation the ReplicaSet controller reads to choose which pods go first when it
/// scales down: the lower the cost, the sooner (after pods that are not Ready, which always
/// go first).
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The deletion cost of the member in the first slot; each later slot costs one less, so
/// every member costs more than a pod outside the rings (no annotation: 0).
const DELETION_COST_TOP: i32 = 1000;
/// Slots read back from a ConfigMap beyond this are ignored (the pool never has more pods).
pub(super) const MAX_SLOT: i32 = memcached_api::MAX_SIZE;

/// A pod of the pool as membership needs it (name, IP, Ready): the status's view of a pod.
pub type PoolPod = crate::status::ObservedPod;

/// The proxy's rings, and the deletion cost each of their pods should carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Every slot of every copy's ring, sorted by copy and slot: a pod, or vacant
    /// ([`ProxyBackend::is_vacant`]).
    pub backends: Vec<ProxyBackend>,
    /// `controller.kubernetes.io/pod-deletion-cost` of each pod in the rings, by name.
    pub deletion_costs: BTreeMap<String, i32>,
}

/// How many slots `copy` has in a pool of `size` pods: the pods are dealt to the copies in
/// [`rank`] order (slot 0 of every copy, then slot 1, ...), so copies differ by one pod at
/// most, and the lower copies get the extra ones.
pub fn capacity(size: i32, copies: i32, copy: i32) -> i32 {
    let copies = copies.max(1);
    ((size - (copy - 1) + copies - 1) / copies).max(0)
}

/// The order in which slots are filled as the pool grows, and emptied as it shrinks.
pub fn rank(copy: i32, slot: i32, copies: i32) -> i32 {
    slot * copies.max(1) + (copy - 1)
}

/// The proxy's rings for a pool of `size` pods in `copies` copies, from the rings recorded
/// in the ConfigMap (`recorded`, vacancies included) and the pool's live `pods`.
///
/// - A pod joins when it is first Ready, into the vacant slot of lowest [`rank`] below
///   its copy's [`capacity`]; with none (a rolling update's extra pod), it waits.
/// - It stays in its slot as long as it lives, Ready or not: a pod that stops answering
///   for a while comes back with the values it holds, and any write or delete of its keys
///   meanwhile must not have gone to another pod (the proxy fails over by itself).
/// - It leaves when it is deleted or has ended; its slot stays, vacant, until a new pod
///   takes it, so its replacement serves exactly its keys and no other key moves.
/// - A ring is as long as it was, but no longer than its capacity, unless a pod holds a
///   later slot; so a scale-down that removed the last slots' pods shortens it, and a
///   scale-up lengthens it only as the new pods join.
/// - When the pool has shrunk and a pod beyond its copy's capacity remains while a slot
///   below it is vacant (the ReplicaSet removed another pod than the last, or `copies`
///   changed), the pod of highest rank moves into the vacancy of lowest rank; only once
///   the pool has no more pods than `size`, so a scale-down still under way moves nobody.
///
/// With warm-up (`spec.proxy.warmUp`), `leaving` lists the pool's stopping pods (deletion
/// requested, not ended, IP known; none without warm-up): a slot whose pod is stopping
/// records it as [`ProxyBackend::warm_from`], vacant or taken by a newcomer, until it has
/// gone, so the proxies read the slot's misses from it (see [`super::render_warm`]).
///
/// With `zones` (`spec.proxy.zones`, one per copy), copy i is the i-th zone's: a pod
/// holds a slot of its own zone's copy only (a pod whose zone is unknown waits), and every
/// copy can hold as many pods as the largest share of `size` a zone gets under the pool's
/// strict zone spread (when the zones cannot share `size` evenly, some rings are one slot
/// shorter). A pod is never moved across copies.
///
/// The deletion costs make the ReplicaSet remove the pod of highest rank first.
pub fn membership(
    recorded: &[ProxyBackend],
    pods: &[PoolPod],
    leaving: &[PoolPod],
    size: i32,
    copies: i32,
    zones: &[String],
    port: i32,
) -> Membership {
    let copies = copies.clamp(1, memcached_api::MAX_PROXY_COPIES);
    let size = size.clamp(0, memcached_api::MAX_SIZE);
    // Zones count only as one per copy (anything else is refused by validation).
    let zones = if zones.len() == copies as usize && copies > 1 {
        zones
    } else {
        &[]
    };
    let zoned = !zones.is_empty();
    let zone_of = |copy: i32| zones.get((copy - 1) as usize);
    // Whether `pod` may hold a slot of `copy`.
    let fits = |pod: &PoolPod, copy: i32| !zoned || pod.zone.as_ref() == zone_of(copy);
    let caps: Vec<i32> = (1..=copies)
        .map(|c| {
            if zoned {
                (size + copies - 1) / copies
            } else {
                capacity(size, copies, c)
            }
        })
        .collect();
    let cap = |copy: i32| caps.get((copy - 1) as usize).copied().unwrap_or(0);
    let mut live: BTreeMap<&str, &PoolPod> = BTreeMap::new();
    for pod in pods {
        live.entry(pod.name.as_str()).or_insert(pod);
    }

    // The recorded rings: each live pod keeps its slot (the first record of a pod or a slot
    // wins); each ring's recorded length, vacancies included.
    let mut recorded_len = vec![0i32; copies as usize];
    let mut slots: BTreeMap<(i32, i32), (&str, String)> = BTreeMap::new();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut ordered: Vec<&ProxyBackend> = recorded
        .iter()
        .filter(|b| b.copy >= 1 && (0..MAX_SLOT).contains(&b.slot))
        .collect();
    ordered.sort();
    for b in ordered {
        if let Some(len) = recorded_len.get_mut((b.copy - 1) as usize) {
            *len = (*len).max(b.slot + 1);
        }
        let Some(pod) = live.get(b.pod.as_str()) else {
            continue;
        };
        if !fits(pod, b.copy) {
            continue;
        }
        if placed.contains(pod.name.as_str()) || slots.contains_key(&(b.copy, b.slot)) {
            continue;
        }
        placed.insert(pod.name.as_str());
        let address = pod
            .ip
            .as_deref()
            .map(|ip| crate::status::endpoint(ip, port))
            .unwrap_or_else(|| b.address.clone());
        slots.insert((b.copy, b.slot), (pod.name.as_str(), address));
    }

    let holes = |slots: &BTreeMap<(i32, i32), (&str, String)>| {
        let mut holes: Vec<(i32, i32)> = (1..=copies)
            .flat_map(|c| (0..cap(c)).map(move |s| (c, s)))
            .filter(|at| !slots.contains_key(at))
            .collect();
        holes.sort_by_key(|&(c, s)| rank(c, s, copies));
        holes
    };

    // Pods beyond their copy's capacity move into vacancies, the last first.
    if live.len() <= size as usize {
        let mut beyond: Vec<(i32, i32)> = slots
            .keys()
            .copied()
            .filter(|&(c, s)| c > copies || s >= cap(c))
            .collect();
        beyond.sort_by_key(|&(c, s)| std::cmp::Reverse(rank(c, s, copies)));
        // With zones, within each copy only.
        let group = |copy: i32| if zoned { copy } else { 0 };
        for g in (1..=copies).map(group).collect::<BTreeSet<i32>>() {
            let to = holes(&slots).into_iter().filter(|&(c, _)| group(c) == g);
            let from: Vec<(i32, i32)> = beyond
                .iter()
                .copied()
                .filter(|&(c, _)| group(c) == g)
                .collect();
            for (hole, from) in to.zip(from) {
                if let Some(member) = slots.remove(&from) {
                    slots.insert(hole, member);
                }
            }
        }
    }
    // Pods of copies that no longer exist and found no place leave the rings, and are
    // newcomers again.
    slots.retain(|&(c, _), (name, _)| {
        if c > copies {
            placed.remove(*name);
        }
        c <= copies
    });

    // Newcomers: Ready pods in no ring, in name order, into the remaining vacancies.
    let newcomers: Vec<&PoolPod> = live
        .values()
        .filter(|p| p.ready && p.ip.is_some() && !placed.contains(p.name.as_str()))
        .copied()
        .collect();
    let mut free = holes(&slots);
    for pod in newcomers {
        let Some(at) = free.iter().position(|&(c, _)| fits(pod, c)) else {
            continue;
        };
        let hole = free.remove(at);
        let ip = pod.ip.as_deref().unwrap_or_default();
        slots.insert(hole, (pod.name.as_str(), crate::status::endpoint(ip, port)));
    }

    // The slots warming up: a slot keeps warming from the stopping pod it warms from (which
    // has had the slot's keys longest, and got the writes since), else from its own pod if
    // that is stopping now.
    let leaving: BTreeMap<&str, &PoolPod> = leaving
        .iter()
        .filter(|p| p.ip.is_some() && !live.contains_key(p.name.as_str()))
        .map(|p| (p.name.as_str(), p))
        .collect();
    let mut warm: BTreeMap<(i32, i32), WarmFrom> = BTreeMap::new();
    for b in recorded {
        let from = b
            .warm_from
            .as_ref()
            .and_then(|w| leaving.get(w.pod.as_str()))
            .or_else(|| leaving.get(b.pod.as_str()));
        if let Some(pod) = from {
            let ip = pod.ip.as_deref().unwrap_or_default();
            warm.entry((b.copy, b.slot)).or_insert_with(|| WarmFrom {
                pod: pod.name.clone(),
                address: crate::status::endpoint(ip, port),
            });
        }
    }

    let mut backends = Vec::new();
    let mut deletion_costs = BTreeMap::new();
    for copy in 1..=copies {
        let last = slots
            .range((copy, 0)..(copy + 1, 0))
            .map(|(&(_, s), _)| s + 1)
            .max()
            .unwrap_or(0);
        let kept = recorded_len[(copy - 1) as usize].min(cap(copy));
        for slot in 0..last.max(kept) {
            match slots.get(&(copy, slot)) {
                Some((pod, address)) => {
                    deletion_costs.insert(
                        pod.to_string(),
                        (DELETION_COST_TOP - rank(copy, slot, copies)).max(1),
                    );
                    backends.push(ProxyBackend {
                        copy,
                        slot,
                        pod: pod.to_string(),
                        address: address.clone(),
                        zone: zone_of(copy).cloned(),
                        warm_from: warm.remove(&(copy, slot)),
                        grown_from: None,
                    });
                }
                None => backends.push(ProxyBackend {
                    copy,
                    slot,
                    zone: zone_of(copy).cloned(),
                    warm_from: warm.remove(&(copy, slot)),
                    ..ProxyBackend::default()
                }),
            }
        }
    }
    Membership {
        backends,
        deletion_costs,
    }
}

/// With warm-up and one copy, the slots a scale-out adds warm up from the ring as it was
/// before it grew ([`ProxyBackend::grown_from`]): from `now` for `propagation` (the
/// proxies' loading of the change) and `warm` more, the proxies read those slots' misses
/// from the pods that held their keys before and write their keys there too (see
/// [`super::render_warm`]). `recorded` is the rings in place, `next` the rings computed
/// from them ([`membership`]) for the live `pods`, marked here.
///
/// - A ring grows by a scale-out when pods join past the recorded length that were created
///   at least `propagation` after every pod of the ring before (so not while a pool is
///   created, its pods joining one by one: there is nothing to warm from).
/// - A growth while the slots still warm keeps the earlier ring (where the keys were before
///   both) and starts the window again.
/// - Nothing is marked while a slot warms up from a replaced pod (those take precedence),
///   nor once the ring is no longer than the ring it grew from.
///
/// Returns when the earliest mark ends, to look again then.
pub fn warm_growth(
    recorded: &[ProxyBackend],
    next: &mut Membership,
    pods: &[PoolPod],
    now: jiff::Timestamp,
    propagation: std::time::Duration,
    warm: std::time::Duration,
) -> Option<jiff::Timestamp> {
    let window = propagation + warm;
    let ring = |bs: &[ProxyBackend]| -> i32 {
        bs.iter()
            .filter(|b| b.copy == 1 && (0..MAX_SLOT).contains(&b.slot))
            .map(|b| b.slot + 1)
            .max()
            .unwrap_or(0)
    };
    let before = ring(recorded);
    let after = ring(&next.backends);
    if next
        .backends
        .iter()
        .any(|b| b.copy != 1 || b.warm_from.is_some())
    {
        return None;
    }
    // The marks still running, as recorded.
    let running: Vec<(i32, jiff::Timestamp)> = recorded
        .iter()
        .filter_map(|b| b.grown_from.as_ref())
        .filter_map(|g| Some((g.slots, g.until.parse::<jiff::Timestamp>().ok()?)))
        .filter(|(_, until)| *until > now)
        .collect();
    // The ring before the growth: before this one, or before the one still warming (the
    // pods of one scale-out may join far apart).
    let base = running
        .iter()
        .map(|(slots, _)| *slots)
        .min()
        .map_or(before, |slots| slots.min(before));
    // When the pods of the ring before (those joining now) were created: the newest of the
    // first, the oldest of the others.
    let created = |earlier: bool| -> Vec<Option<jiff::Timestamp>> {
        next.backends
            .iter()
            .filter(|b| !b.is_vacant())
            .filter(|b| {
                if earlier {
                    b.slot < base
                } else {
                    b.slot >= before
                }
            })
            .map(|b| {
                pods.iter()
                    .find(|p| p.name == b.pod)
                    .and_then(|p| p.created)
            })
            .collect()
    };
    let (old, new) = (created(true), created(false));
    let scale_out = match (
        old.iter().copied().collect::<Option<Vec<_>>>(),
        new.iter().copied().collect::<Option<Vec<_>>>(),
    ) {
        (Some(old), Some(new)) => match (old.iter().max(), new.iter().min()) {
            (Some(newest), Some(oldest)) => jiff::SignedDuration::try_from(propagation)
                .is_ok_and(|gap| oldest.duration_since(*newest) >= gap),
            _ => false,
        },
        _ => false,
    };
    let grew = base > 0 && after > before && scale_out;
    let from = running
        .iter()
        .map(|(slots, _)| *slots)
        .chain(grew.then_some(before))
        .min()?;
    let until = if grew {
        now.checked_add(jiff::SignedDuration::try_from(window).ok()?)
            .ok()?
    } else {
        running.iter().map(|(_, until)| *until).max()?
    };
    if from <= 0 || after <= from {
        return None;
    }
    let mark = GrownFrom {
        slots: from,
        until: until.to_string(),
    };
    for b in next.backends.iter_mut().filter(|b| b.slot >= from) {
        b.grown_from = Some(mark.clone());
    }
    Some(until)
}

/// A backend as recorded in a ConfigMap: written before slots existed, it has none.
#[derive(Deserialize)]
struct Recorded {
    copy: i32,
    slot: Option<i32>,
    #[serde(default)]
    pod: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default, rename = "warmFrom")]
    warm_from: Option<WarmFrom>,
    #[serde(default, rename = "grownFrom")]
    grown_from: Option<GrownFrom>,
}

/// The backends recorded in a ConfigMap's data (its JSON text as cached), or none. A record
/// written before slots existed (one list of Ready pods per copy, sorted by name) gets
/// them in its order.
pub fn recorded_backends(data_json: &str) -> Vec<ProxyBackend> {
    let recorded: Vec<Recorded> = serde_json::from_str::<BTreeMap<String, String>>(data_json)
        .ok()
        .and_then(|data| serde_json::from_str(data.get(BACKENDS_KEY)?).ok())
        .unwrap_or_default();
    let mut next: BTreeMap<i32, i32> = BTreeMap::new();
    recorded
        .into_iter()
        .map(|r| {
            let slot = r.slot.unwrap_or_else(|| {
                let n = next.entry(r.copy).or_insert(0);
                *n += 1;
                *n - 1
            });
            ProxyBackend {
                copy: r.copy,
                slot,
                pod: r.pod,
                address: r.address,
                zone: r.zone,
                warm_from: r.warm_from,
                grown_from: r.grown_from,
            }
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const PORT: i32 = 11211;

    /// A pod with an IP of its own.
    fn pod(name: &str, ready: bool) -> PoolPod {
        let n: u32 = name.bytes().map(u32::from).sum();
        PoolPod {
            zone: None,
            created: None,
            name: name.to_string(),
            ip: Some(format!("10.0.{}.{}", n / 250, n % 250 + 1)),
            ready,
        }
    }

    pub(in crate::proxy) fn ready(names: &[&str]) -> Vec<PoolPod> {
        names.iter().map(|n| pod(n, true)).collect()
    }

    /// Copy `copy`'s ring, slot by slot ("" for a vacant slot).
    fn ring(m: &Membership, copy: i32) -> Vec<&str> {
        let slots: Vec<i32> = m
            .backends
            .iter()
            .filter(|b| b.copy == copy)
            .map(|b| b.slot)
            .collect();
        assert_eq!(slots, (0..slots.len() as i32).collect::<Vec<_>>(), "{m:?}");
        m.backends
            .iter()
            .filter(|b| b.copy == copy)
            .map(|b| b.pod.as_str())
            .collect()
    }

    fn cost(m: &Membership, pod: &str) -> Option<i32> {
        m.deletion_costs.get(pod).copied()
    }

    /// The next membership from `m`'s record, and that computing it again changes nothing.
    pub(in crate::proxy) fn next(
        m: &Membership,
        pods: &[PoolPod],
        size: i32,
        copies: i32,
    ) -> Membership {
        let next = membership(&m.backends, pods, &[], size, copies, &[], PORT);
        assert_eq!(
            membership(&next.backends, pods, &[], size, copies, &[], PORT),
            next,
            "stable"
        );
        next
    }

    #[test]
    fn a_pod_keeps_its_slot_until_it_is_gone_ready_or_not() {
        let empty = Membership::default();
        let first = next(&empty, &ready(&["c", "a", "b"]), 3, 1);
        assert_eq!(ring(&first, 1), ["a", "b", "c"], "newcomers in name order");
        assert_eq!(
            (cost(&first, "a"), cost(&first, "b"), cost(&first, "c")),
            (Some(1000), Some(999), Some(998)),
            "the last slot is the cheapest"
        );

        // b stops being Ready, even loses its IP: nothing changes, not even its address.
        let mut flapping = vec![pod("a", true), pod("b", false), pod("c", true)];
        assert_eq!(next(&first, &flapping, 3, 1), first);
        flapping[1].ip = None;
        assert_eq!(next(&first, &flapping, 3, 1), first);

        // b is deleted: its slot stays, vacant; a pod that is not Ready yet does not join.
        let gone = next(
            &first,
            &[pod("a", true), pod("c", true), pod("d", false)],
            3,
            1,
        );
        assert_eq!(ring(&gone, 1), ["a", "", "c"]);
        assert_eq!(cost(&gone, "d"), None);
        assert!(gone.backends[1].is_vacant() && gone.backends[1].address.is_empty());
        // Once Ready, the replacement takes b's slot and b's cost.
        let replaced = next(&gone, &ready(&["a", "c", "d"]), 3, 1);
        assert_eq!(ring(&replaced, 1), ["a", "d", "c"]);
        assert_eq!(cost(&replaced, "d"), Some(999));
        assert_eq!(replaced.backends[1].address, "10.0.0.101:11211");
        // The last slot's pod is replaced: the ring keeps its length meanwhile.
        let last_gone = next(&replaced, &ready(&["a", "d"]), 3, 1);
        assert_eq!(ring(&last_gone, 1), ["a", "d", ""]);
        let last_back = next(&last_gone, &ready(&["a", "d", "0new"]), 3, 1);
        assert_eq!(ring(&last_back, 1), ["a", "d", "0new"]);
        // An ended or deleted pod is not among the live pods: same as gone.
        let all_gone = next(&last_back, &[], 3, 1);
        assert_eq!(ring(&all_gone, 1), ["", "", ""]);
        assert!(all_gone.deletion_costs.is_empty());
    }

    #[test]
    fn the_ring_grows_as_pods_join_and_shrinks_by_its_last_slots() {
        let three = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        // 3 → 4: no slot until the new pod is Ready, then the fourth.
        let mut pods = vec![
            pod("a", true),
            pod("b", true),
            pod("c", true),
            pod("d", false),
        ];
        assert_eq!(ring(&next(&three, &pods, 4, 1), 1), ["a", "b", "c"]);
        pods[3].ready = true;
        let four = next(&three, &pods, 4, 1);
        assert_eq!(ring(&four, 1), ["a", "b", "c", "d"]);
        assert_eq!(cost(&four, "d"), Some(997));
        // 4 → 3: the ring stays as long as d lives, and loses its last slot when d goes.
        assert_eq!(next(&four, &pods, 3, 1), four);
        let back = next(&four, &ready(&["a", "b", "c"]), 3, 1);
        assert_eq!(ring(&back, 1), ["a", "b", "c"]);

        // A rolling update's extra pod waits for a slot, and takes the one freed.
        let surge = next(&back, &ready(&["a", "b", "c", "e"]), 3, 1);
        assert_eq!(surge, back);
        let rolled = next(&surge, &ready(&["a", "b", "e"]), 3, 1);
        assert_eq!(ring(&rolled, 1), ["a", "b", "e"]);

        // 4 → 2, the ReplicaSet removing b (not Ready, say) and d. While it is under way
        // nobody moves; then c, beyond the capacity, moves into b's slot.
        let halfway = next(&four, &ready(&["a", "c", "d"]), 2, 1);
        assert_eq!(ring(&halfway, 1), ["a", "", "c", "d"]);
        let two = next(&halfway, &ready(&["a", "c"]), 2, 1);
        assert_eq!(ring(&two, 1), ["a", "c"]);
        assert_eq!(cost(&two, "c"), Some(999));
    }

    /// The next membership with warm-up, `leaving` stopping; stable like [`next`].
    fn next_warm(m: &Membership, pods: &[PoolPod], leaving: &[PoolPod], size: i32) -> Membership {
        let next = membership(&m.backends, pods, leaving, size, 1, &[], PORT);
        assert_eq!(
            membership(&next.backends, pods, leaving, size, 1, &[], PORT),
            next,
            "stable"
        );
        next
    }

    /// Each slot's pod and the pod it warms up from ("" for none).
    fn warming(m: &Membership) -> Vec<(&str, &str)> {
        m.backends
            .iter()
            .map(|b| {
                let from = b.warm_from.as_ref().map_or("", |w| w.pod.as_str());
                (b.pod.as_str(), from)
            })
            .collect()
    }

    #[test]
    fn a_replaced_pods_slot_warms_up_from_it_while_it_stops() {
        let three = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        // A rollout's new pod waits; b is deleted and stops: its slot warms from it, the
        // new pod takes the slot in the same step.
        let stopping = [pod("b", true)];
        let rolled = next_warm(&three, &ready(&["a", "c", "d"]), &stopping, 3);
        assert_eq!(warming(&rolled), [("a", ""), ("d", "b"), ("c", "")]);
        let from = rolled.backends[1].warm_from.clone().unwrap_or_default();
        assert_eq!(
            from.address,
            format!("{}:{PORT}", pod("b", true).ip.unwrap_or_default())
        );
        assert_eq!(cost(&rolled, "b"), None, "a stopping pod has no cost");
        // Without a replacement yet, the vacant slot warms from it.
        let vacant = next_warm(&three, &ready(&["a", "c"]), &stopping, 3);
        assert_eq!(warming(&vacant), [("a", ""), ("", "b"), ("c", "")]);
        let joined = next_warm(&vacant, &ready(&["a", "c", "d"]), &stopping, 3);
        assert_eq!(joined, rolled);
        // The new pod replaced in turn while b still stops: b's warm-up is kept (the keys
        // are still more likely there), d only stops.
        let again = next_warm(
            &rolled,
            &ready(&["a", "c", "e"]),
            &[pod("b", true), pod("d", true)],
            3,
        );
        assert_eq!(warming(&again), [("a", ""), ("e", "b"), ("c", "")]);
        // b has gone: the slot is e's alone (d, which held it briefly, is not recorded).
        let done = next_warm(&again, &ready(&["a", "c", "e"]), &[pod("d", true)], 3);
        assert_eq!(warming(&done), [("a", ""), ("e", ""), ("c", "")]);
        // A stopping pod without an IP serves nothing, and a live pod never warms a slot.
        let no_ip = PoolPod {
            ip: None,
            ..pod("b", true)
        };
        let cold = next_warm(&three, &ready(&["a", "c", "d"]), &[no_ip], 3);
        assert_eq!(warming(&cold), [("a", ""), ("d", ""), ("c", "")]);
        assert_eq!(
            next_warm(&three, &ready(&["a", "b", "c"]), &stopping, 3),
            three
        );
        // A scale-down's last slot goes with its pod: nothing warms from it.
        let down = next_warm(&three, &ready(&["a", "b"]), &[pod("c", true)], 2);
        assert_eq!(warming(&down), [("a", ""), ("b", "")]);
        // The record reads back with the warm-up.
        let written = serde_json::json!({
            BACKENDS_KEY: serde_json::to_string(&rolled.backends).unwrap_or_default(),
        })
        .to_string();
        assert_eq!(recorded_backends(&written), rolled.backends);
    }

    #[test]
    fn copies_are_filled_slot_by_slot_and_a_change_of_copies_moves_few_pods() {
        let four = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 4, 2);
        assert_eq!(
            (ring(&four, 1), ring(&four, 2)),
            (vec!["a", "c"], vec!["b", "d"])
        );
        let costs: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|p| cost(&four, p))
            .collect();
        assert_eq!(costs, [Some(1000), Some(999), Some(998), Some(997)]);
        // A fifth pod: the third slot of copy 1, the cheapest.
        let five = next(&four, &ready(&["a", "b", "c", "d", "e"]), 5, 2);
        assert_eq!(
            (ring(&five, 1), ring(&five, 2)),
            (vec!["a", "c", "e"], vec!["b", "d"])
        );
        assert_eq!(cost(&five, "e"), Some(996));
        // A pod of copy 2 replaced: the replacement goes to copy 2, same slot.
        let replaced = next(&five, &ready(&["a", "b", "c", "e", "f"]), 5, 2);
        assert_eq!(ring(&replaced, 2), ["b", "f"]);

        // copies 1 → 2 on 4 pods: the last two move to copy 2, the rest stay.
        let single = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 4, 1);
        let raised = next(&single, &ready(&["a", "b", "c", "d"]), 4, 2);
        assert_eq!(
            (ring(&raised, 1), ring(&raised, 2)),
            (vec!["a", "b"], vec!["d", "c"])
        );
        // 2 → 1: copy 2's pods go to the end of copy 1.
        let lowered = next(&four, &ready(&["a", "b", "c", "d"]), 4, 1);
        assert_eq!(ring(&lowered, 1), ["a", "c", "d", "b"]);
        // More copies than pods: the empty copies have no ring.
        let thin = next(&Membership::default(), &ready(&["a"]), 1, 3);
        assert_eq!((ring(&thin, 1), ring(&thin, 2)), (vec!["a"], vec![]));
    }

    /// A pod in `zone`.
    fn zoned(name: &str, zone: &str) -> PoolPod {
        PoolPod {
            zone: Some(zone.to_string()),
            ..pod(name, true)
        }
    }

    fn next_zoned(m: &Membership, pods: &[PoolPod], size: i32, zones: &[&str]) -> Membership {
        let zones: Vec<String> = zones.iter().map(|z| z.to_string()).collect();
        let copies = zones.len() as i32;
        let next = membership(&m.backends, pods, &[], size, copies, &zones, PORT);
        assert_eq!(
            membership(&next.backends, pods, &[], size, copies, &zones, PORT),
            next,
            "stable"
        );
        next
    }

    #[test]
    fn with_zones_each_copy_holds_its_own_zones_pods_only() {
        let zones = ["za", "zb", "zc"];
        // Names that would deal a, b, c to copies 1, 2, 3 without zones.
        let pods = [
            zoned("a", "zc"),
            zoned("b", "za"),
            zoned("c", "zb"),
            zoned("d", "zc"),
            zoned("e", "za"),
            zoned("f", "zb"),
        ];
        let m = next_zoned(&Membership::default(), &pods, 6, &zones);
        assert_eq!(ring(&m, 1), ["b", "e"]);
        assert_eq!(ring(&m, 2), ["c", "f"]);
        assert_eq!(ring(&m, 3), ["a", "d"]);
        for b in &m.backends {
            assert_eq!(
                b.zone.as_deref(),
                Some(zones[(b.copy - 1) as usize]),
                "{b:?}"
            );
        }
        // The ReplicaSet removes one pod per zone first on a scale-down: slot 1 of each.
        let last: Vec<i32> = ["a", "d", "e", "f"]
            .iter()
            .map(|p| cost(&m, p).unwrap_or(0))
            .collect();
        assert!(
            last[1] < last[0] && last[2] < last[0] && last[3] < last[0],
            "{m:?}"
        );

        // A pod whose zone is unknown (no label yet), or in a zone not listed, waits even
        // where a slot is free; a third pod in za waits too: its copy is full.
        let mut more = pods.to_vec();
        more.remove(0); // a (zc, slot 0) is gone: zc's slot 0 is vacant
        more.push(PoolPod {
            zone: None,
            ..pod("g", true)
        });
        more.push(zoned("h", "zd"));
        more.push(zoned("i", "za"));
        let gone = next_zoned(&m, &more, 6, &zones);
        assert_eq!(ring(&gone, 3), ["", "d"], "{gone:?}");
        assert_eq!(ring(&gone, 1), ["b", "e"]);
        // The replacement in zc takes it.
        more.push(zoned("j", "zc"));
        let back = next_zoned(&gone, &more, 6, &zones);
        assert_eq!(ring(&back, 3), ["j", "d"]);

        // Uneven: 5 pods over 3 zones (2, 2, 1): every pod has a slot, the short ring
        // has one less.
        let five = next_zoned(&Membership::default(), &pods[..5], 5, &zones);
        assert_eq!(
            (
                ring(&five, 1).len(),
                ring(&five, 2).len(),
                ring(&five, 3).len()
            ),
            (2, 1, 2),
            "{five:?}"
        );
        assert_eq!(five.deletion_costs.len(), 5);

        // A scale-down that leaves a zone's later pod beside a vacancy of another zone
        // moves nobody across zones.
        let shrunk = next_zoned(
            &m,
            &[zoned("b", "za"), zoned("f", "zb"), zoned("a", "zc")],
            3,
            &zones,
        );
        assert_eq!(ring(&shrunk, 1), ["b"]);
        assert_eq!(
            ring(&shrunk, 2),
            ["f"],
            "within its zone, f moves to slot 0"
        );
        assert_eq!(ring(&shrunk, 3), ["a"]);

        // The zones listed in another order: every pod whose zone is not its copy's leaves
        // and joins its zone's copy.
        let reordered = next_zoned(&m, &pods, 6, &["zb", "zc", "za"]);
        assert_eq!(ring(&reordered, 1), ["c", "f"]);
        assert_eq!(ring(&reordered, 3), ["b", "e"]);

        // Without zones (or with a list that does not match the copies), zones are ignored.
        let plain = membership(&[], &pods, &[], 6, 3, &[], PORT);
        assert_eq!(
            plain.backends.iter().filter(|b| b.zone.is_some()).count(),
            0
        );
        let two = ["za".to_string(), "zb".to_string()];
        assert_eq!(membership(&[], &pods, &[], 6, 3, &two, PORT), plain);
    }

    #[test]
    fn a_scale_out_warms_its_new_slots_for_a_while() {
        let now: jiff::Timestamp = "2026-11-28T10:00:00Z".parse().unwrap_or_default();
        let later = |s: i64| now + jiff::SignedDuration::from_secs(s);
        let (propagation, warm) = (
            std::time::Duration::from_secs(100),
            std::time::Duration::from_secs(60),
        );
        // When each pod was created: a and b with the pool, long before; c and d by
        // scale-outs; e a second after a, as a pool's pods are created together.
        let created = |name: &str| match name {
            "c" | "f" => later(-10),
            "d" => later(90),
            "e" => later(-999),
            _ => later(-1000),
        };
        let live = |names: &[&str]| -> Vec<PoolPod> {
            names
                .iter()
                .map(|n| PoolPod {
                    created: Some(created(n)),
                    ..pod(n, true)
                })
                .collect()
        };
        let grow = |recorded: &Membership, names: &[&str], size: i32, at: jiff::Timestamp| {
            let pods = live(names);
            let mut m = membership(&recorded.backends, &pods, &[], size, 1, &[], PORT);
            let until = warm_growth(&recorded.backends, &mut m, &pods, at, propagation, warm);
            (m, until)
        };
        let marks = |m: &Membership| -> Vec<Option<(i32, String)>> {
            m.backends
                .iter()
                .map(|b| b.grown_from.as_ref().map(|g| (g.slots, g.until.clone())))
                .collect()
        };
        // A new pool grows from nothing, its pods joining one by one: nothing to warm from.
        let (one, until) = grow(&Membership::default(), &["a"], 2, now);
        assert_eq!((until, marks(&one)), (None, vec![None]));
        let (two, until) = grow(&one, &["a", "e"], 2, now);
        assert_eq!((until, marks(&two)), (None, vec![None, None]));
        let two = grow(&Membership::default(), &["a", "b"], 2, now).0;
        // 2 → 3: slot 2 warms from the ring of 2 for the window.
        let (three, until) = grow(&two, &["a", "b", "c"], 3, now);
        let end = later(160);
        assert_eq!(until, Some(end));
        assert_eq!(marks(&three), [None, None, Some((2, end.to_string()))]);
        // Nothing changes meanwhile: the mark stays, with its end.
        assert_eq!(
            grow(&three, &["a", "b", "c"], 3, later(100)),
            (three.clone(), Some(end))
        );
        // 3 → 4 within the window: both new slots warm from the ring of 2, for a new window
        // (d was created 100 s after c).
        let (four, until) = grow(&three, &["a", "b", "c", "d"], 4, later(100));
        let end = later(260);
        assert_eq!(until, Some(end));
        assert_eq!(
            marks(&four),
            [
                None,
                None,
                Some((2, end.to_string())),
                Some((2, end.to_string()))
            ]
        );
        // Created together by one scale-out (c and f), joined 150 s apart: f's slot
        // warms too, for a new window.
        let (three, _) = grow(&two, &["a", "b", "c"], 3, now);
        let (joined_late, until) = grow(&three, &["a", "b", "c", "f"], 4, later(150));
        assert_eq!(until, Some(later(310)));
        assert_eq!(
            marks(&joined_late)[2..],
            [
                Some((2, later(310).to_string())),
                Some((2, later(310).to_string()))
            ]
        );
        // Over: plain again.
        let (over, until) = grow(&four, &["a", "b", "c", "d"], 4, later(260));
        assert_eq!((until, marks(&over)), (None, vec![None; 4]));
        // A pod created with the ring's last one does not start a warm-up.
        let (late, until) = grow(&two, &["a", "b", "e"], 3, now);
        assert_eq!((until, marks(&late)), (None, vec![None; 3]));
        // Shrunk back to the ring it grew from within the window: nothing to warm.
        let (back, until) = grow(&three, &["a", "b"], 2, later(10));
        assert_eq!((until, marks(&back)), (None, vec![None, None]));
        // A slot warming from a replaced pod takes precedence.
        let pods = live(&["a", "b", "c", "d"]);
        let mut replacing = membership(&three.backends, &pods, &[], 4, 1, &[], PORT);
        replacing.backends[0].warm_from = Some(WarmFrom::default());
        let marked = warm_growth(
            &three.backends,
            &mut replacing,
            &pods,
            later(10),
            propagation,
            warm,
        );
        assert_eq!(marked, None);
        assert!(replacing.backends.iter().all(|b| b.grown_from.is_none()));
        // Copies: never.
        let copies = next(&Membership::default(), &live(&["a", "b"]), 2, 2);
        let mut grown = membership(&copies.backends, &pods, &[], 4, 2, &[], PORT);
        assert_eq!(
            warm_growth(&copies.backends, &mut grown, &pods, now, propagation, warm),
            None
        );
    }

    #[test]
    fn records_from_before_slots_get_them_in_order() {
        let data = serde_json::json!({
            BACKENDS_KEY: r#"[{"copy":1,"pod":"a","address":"10.0.0.1:11211"},
                             {"copy":1,"pod":"b","address":"10.0.0.2:11211"},
                             {"copy":2,"pod":"c","address":"10.0.0.3:11211"}]"#,
        })
        .to_string();
        let slots: Vec<(i32, i32, String)> = recorded_backends(&data)
            .into_iter()
            .map(|b| (b.copy, b.slot, b.pod))
            .collect();
        assert_eq!(
            slots,
            [(1, 0, "a".into()), (1, 1, "b".into()), (2, 0, "c".into())]
        );
        // And a record with slots reads back as written.
        let m = next(&Membership::default(), &ready(&["a", "b"]), 3, 1);
        let gone = next(&m, &ready(&["a"]), 3, 1);
        let written = serde_json::json!({
            BACKENDS_KEY: serde_json::to_string(&gone.backends).unwrap_or_default(),
        })
        .to_string();
        assert_eq!(recorded_backends(&written), gone.backends);
        assert_eq!(recorded_backends("not json"), []);
    }
}
