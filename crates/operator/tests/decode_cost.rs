//! What answering a review costs in memory, measured: the peak of what the webhooks'
//! handlers allocate for a body (counted by this binary's allocator) stays within what the
//! webhook server holds for that body in its memory budget beyond the body itself, three
//! times `webhook::decoded_size` (`webhook::limits::HELD_PER_BODY_BYTE`), for ordinary
//! reviews and for JSON built to cost the most per byte.
//!
//! And what a subscriber of an idle cache holds: the operator subscribes to each kind it
//! watches in each namespace, so room kept per subscription for objects that have not come
//! is paid hundreds of times over by an operator watching many namespaces.
//!
//! And what a cached Deployment holds: its spec's text is shared with every pool's made from
//! the same template. And what the problem series of pools being created hold.
//!
//! A test binary of its own: it replaces the global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use memcached_operator::webhook::limits::HELD_PER_BODY_BYTE;
use memcached_operator::webhook::{self, Endpoint};
use serde_json::{Value, json};

/// Counts the bytes allocated by the thread that turned counting on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static NOW: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let now = NOW.with(|n| {
                n.set(n.get() + delta);
                n.get()
            });
            PEAK.with(|p| p.set(p.get().max(now)));
        }
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the counting touches
// only const-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Both blocks may exist at once while the bytes are copied.
        count(new_size as isize);
        count(-(layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returns, what it made and still holds in that on this thread, and the most it
/// had allocated at once, beyond what was allocated before.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    NOW.with(|n| n.set(0));
    PEAK.with(|p| p.set(0));
    COUNTING.with(|c| c.set(true));
    let kept = f();
    COUNTING.with(|c| c.set(false));
    let held = NOW.with(|n| n.get()).max(0) as usize;
    (kept, held, PEAK.with(|p| p.get()).max(0) as usize)
}

/// The most `f` had allocated at once on this thread, beyond what was allocated before.
fn peak_of(f: impl FnOnce()) -> usize {
    counted(f).2
}

fn memcached(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "memcached.cache.example.com/v1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": "default", "uid": "6d9b2a4e-0000-4000-8000-000000000001"},
        "spec": spec,
    })
}

fn review(operation: &str, object: Value, old: Value) -> Vec<u8> {
    let gvk = json!({"group": "memcached.cache.example.com", "version": "v1", "kind": "Memcached"});
    let gvr =
        json!({"group": "memcached.cache.example.com", "version": "v1", "resource": "memcacheds"});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object["metadata"]["name"].clone(),
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    });
    serde_json::to_vec(&review).expect("JSON")
}

/// Bodies from an ordinary review to JSON packed to cost the most per byte.
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let ordinary = memcached("cache", json!({"size": 3, "containerPort": 11211}));
    let mut annotated = ordinary.clone();
    annotated["metadata"]["annotations"] = json!({
        "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(250 * 1024),
    });
    let mut resized = annotated.clone();
    resized["spec"]["size"] = json!(5);
    let mut many = ordinary.clone();
    many["metadata"]["annotations"] = (0..8_000)
        .map(|i| (format!("example.com/a{i}"), json!("")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let mut tolerations = ordinary.clone();
    tolerations["spec"]["tolerations"] = (0..2_000)
        .map(|i| json!({"key": format!("k{i}"), "operator": "Exists", "effect": "NoSchedule"}))
        .collect::<Vec<_>>()
        .into();
    let mut escaped = ordinary.clone();
    escaped["metadata"]["annotations"] = json!({"quotes": "\"".repeat(200 * 1024)});
    let dense_in = |filler: &str, items: usize| {
        let mut object = ordinary.clone();
        object["dense"] = json!("FILLER");
        let text = String::from_utf8(review("CREATE", object, Value::Null)).expect("UTF-8");
        text.replace(
            "\"FILLER\"",
            &format!("[{}]", vec![filler; items].join(",")),
        )
        .into_bytes()
    };
    vec![
        (
            "an ordinary create",
            review("CREATE", ordinary.clone(), Value::Null),
        ),
        (
            "an update with 250 KiB of annotations",
            review("UPDATE", resized, annotated),
        ),
        ("8,000 annotations", review("CREATE", many, Value::Null)),
        (
            "2,000 tolerations",
            review("CREATE", tolerations, Value::Null),
        ),
        (
            "200 KiB of escaped quotes",
            review("CREATE", escaped, Value::Null),
        ),
        ("one-key objects", dense_in(r#"{"a":0}"#, 100_000)),
        ("empty arrays", dense_in("[]", 200_000)),
        ("zeros", dense_in("0", 300_000)),
        ("one-character strings", dense_in(r#""a""#, 200_000)),
    ]
}

#[test]
fn answering_a_review_takes_no_more_than_the_budget_holds_for_it() {
    // What is made once per process (the CRD schema's defaults, read on first use) is not a
    // request's.
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let body = review("CREATE", memcached("warm", json!({"size": 1})), Value::Null);
        let _ = webhook::handle(endpoint, &body, memcached_api::DEFAULT_IMAGE);
    }
    for (what, body) in bodies() {
        let estimate = webhook::decoded_size(&body);
        let held = estimate * (HELD_PER_BODY_BYTE - 1);
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            let peak = peak_of(|| {
                let answer = webhook::handle(endpoint, &body, memcached_api::DEFAULT_IMAGE);
                drop(answer);
            });
            println!(
                "{what} ({endpoint:?}): body {} KiB, decoded-size estimate {} KiB, peak {} KiB, held {} KiB ({:.2} of it)",
                body.len() / 1024,
                estimate / 1024,
                peak / 1024,
                held / 1024,
                peak as f64 / held as f64
            );
            assert!(
                peak <= held,
                "{what} ({endpoint:?}): answering took {peak} bytes, more than the {held} held for it"
            );
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_subscriber_of_an_idle_cache_holds_no_room_for_objects() {
    use kube::Api;
    use kube::runtime::watcher;
    use memcached_operator::cached::CachedPod;
    use memcached_operator::informer::Informer;

    let server = apisim::ApiServer::builder().build();
    let pods: Api<CachedPod> = Api::namespaced(server.client(), "default");
    let informer = Informer::start(pods, watcher::Config::default(), |_| {});
    informer.wait_synced().await;
    const SUBSCRIBERS: usize = 20;
    let (streams, held, _) = counted(|| {
        (0..SUBSCRIBERS)
            .map(|_| informer.subscribe())
            .collect::<Vec<_>>()
    });
    let each = held / SUBSCRIBERS;
    println!(
        "a subscriber of an empty pod cache holds {each} bytes (a cached pod is {} bytes inline)",
        std::mem::size_of::<CachedPod>()
    );
    // A channel of objects keeps room for 32 of them from the start: 15.9 KB of pods.
    assert!(
        each <= 2048,
        "each subscriber holds {each} bytes before any change"
    );
    drop(streams);
}

/// What the cache holds per pool for its Deployment: pools made from one Memcached template
/// differ in their Deployments' specs only by their names (and in their metadata's texts by
/// their names and owners' uids), and the cache keeps those texts once, so a Deployment
/// costs its typed metadata and status, not its 2 KB pod template and labels again.
#[test]
fn deployments_of_one_template_hold_their_spec_once() {
    use memcached_api::Memcached;
    use memcached_operator::builders::{BuildSettings, desired_deployment};
    use memcached_operator::cached::CachedDeployment;
    use memcached_operator::drift;

    const POOLS: usize = 200;
    let settings = BuildSettings::default();
    let sent: Vec<String> = (0..POOLS)
        .map(|i| {
            let mut mc: Memcached =
                serde_json::from_value(memcached(&format!("pool-{i:05}"), json!({"size": 3})))
                    .expect("a Memcached");
            mc.metadata.uid = Some(format!("6d9b2a4e-0000-4000-8000-{i:012}"));
            let mut deployment =
                serde_json::to_value(desired_deployment(&mc, &settings).expect("builds"))
                    .expect("JSON");
            // The annotations the operator's apply and the Deployment controller add: a
            // hash of the pool's own desired state, and the revision.
            let hash = drift::desired_hash(&deployment);
            let annotations = &mut deployment["metadata"]["annotations"];
            annotations["deployment.kubernetes.io/revision"] = json!("1");
            annotations["memcached.cache.example.com/applied-hash"] = json!(hash);
            deployment["metadata"]["uid"] = json!(format!("0c1f0e7e-0000-4000-8000-{i:012}"));
            deployment["metadata"]["resourceVersion"] = json!(format!("{}", 100_000 + i));
            deployment["status"] = json!({"observedGeneration": 1, "replicas": 3,
                "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3});
            deployment.to_string()
        })
        .collect();
    let spec_bytes = serde_json::from_str::<Value>(&sent[0]).expect("JSON")["spec"]
        .to_string()
        .len();
    let (cached, held, _) = counted(|| {
        sent.iter()
            .map(|text| serde_json::from_str::<CachedDeployment>(text).expect("cached"))
            .map(std::sync::Arc::new)
            .collect::<Vec<_>>()
    });
    let each = held / POOLS;
    println!("a cached Deployment holds {each} bytes; its spec is {spec_bytes} bytes of JSON");
    assert!(
        each < spec_bytes,
        "each cached Deployment holds {each} bytes, more than its spec's {spec_bytes}"
    );
    // The labels, annotations and ownerReferences too: one text, the pool's name and uid
    // put back from the metadata and the uid kept beside it.
    use memcached_operator::cached::CacheForm;
    assert!(
        cached[0]
            .meta_text()
            .shares_with(cached[POOLS - 1].meta_text())
    );
    drop(cached);
}

/// What the `memcached_operator_pool_problem` series of new pools hold: while 10,000 pools
/// are created each has two (Ready and Available False until its pods are), and the series'
/// labels are kept once, in the metric (the pool's own list, to remove them by, names only
/// the conditions and reasons).
#[test]
fn the_problems_of_new_pools_are_held_once() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::runtime::reflector::ObjectRef;
    use memcached_api::Memcached;
    use memcached_operator::controller::telemetry::Telemetry;

    const POOLS: usize = 1_000;
    let metrics = manager::Metrics::new();
    let telemetry = Telemetry::register(&metrics);
    let condition = |type_: &str, reason: &str| Condition {
        type_: type_.into(),
        status: "False".into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: Time(Default::default()),
        observed_generation: None,
    };
    let conditions = [
        condition("Available", "MinimumReplicasUnavailable"),
        condition("Ready", "PodsNotReady"),
    ];
    let pools: Vec<ObjectRef<Memcached>> = (0..POOLS)
        .map(|i| ObjectRef::new(&format!("pool-{i:05}")).within(&format!("team-{:03}", i % 100)))
        .collect();
    let ((), held, _) = counted(|| {
        for pool in &pools {
            telemetry.set_problems(pool, &conditions);
        }
    });
    let series = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("memcached_operator_pool_problem{"))
        .count();
    assert_eq!(series, 2 * POOLS);
    let each = held / POOLS;
    println!("the problem series of a new pool hold {each} bytes");
    // 1,212 bytes; 1,502 with a second copy of each series' labels in the pool's own list.
    assert!(
        each < 1_400,
        "a new pool's two problem series hold {each} bytes"
    );
}

/// What the pod cache holds per pod, the store's own bookkeeping included: a pool's pods
/// are most of what an operator of many pools caches (30,000 at 10,000 pools), and the
/// store files each under its namespace and name without copying them (8 bytes a slot,
/// where kube-runtime's reflector keeps a copy of the name, namespace, resourceVersion and
/// uid in a 104-byte slot).
#[test]
fn the_pod_cache_keeps_no_copy_of_a_pods_identity() {
    use kube::runtime::watcher::Event;
    use memcached_operator::cached::CachedPod;
    use memcached_operator::informer::Store;

    const PODS: usize = 3_000;
    let sent: Vec<String> = (0..PODS)
        .map(|i| {
            let pool = format!("pool-{:05}", i / 3);
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": format!("{pool}-7d9f8c6b5d-{:05x}", i),
                    "namespace": format!("mc-bench-{}", i % 100),
                    "uid": format!("0c1f0e7e-0000-4000-8000-{i:012}"),
                    "resourceVersion": format!("{}", 1_000_000 + i),
                    "creationTimestamp": "2026-11-29T08:00:00Z",
                    "labels": {
                        "app.kubernetes.io/name": "memcached",
                        "app.kubernetes.io/instance": pool,
                        "app.kubernetes.io/managed-by": "memcached-operator",
                        "pod-template-hash": "7d9f8c6b5d",
                    },
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": format!("{pool}-7d9f8c6b5d"), "controller": true,
                        "uid": format!("1c1f0e7e-0000-4000-8000-{i:012}")}],
                },
                "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6"}]},
                "status": {"phase": "Running", "podIP": format!("10.0.{}.{}", i / 250, i % 250),
                    "conditions": [{"type": "Ready", "status": "True"}]},
            })
            .to_string()
        })
        .collect();
    let parse = |text: &String| serde_json::from_str::<CachedPod>(text).expect("a cached pod");
    let (objects, objects_held, _) = counted(|| {
        sent.iter()
            .map(|t| std::sync::Arc::new(parse(t)))
            .collect::<Vec<_>>()
    });
    drop(objects);
    let ((store, writer), held, _) = counted(|| {
        let (store, mut writer) = Store::<CachedPod>::new();
        for text in &sent {
            writer.apply(Event::Apply(parse(text)));
        }
        (store, writer)
    });
    assert_eq!(store.len(), PODS);
    let each = held / PODS;
    let own = objects_held.saturating_sub(PODS * 8) / PODS;
    println!("the pod cache holds {each} bytes per pod; each pod's own objects are {own}");
    // The table of `Arc`s grows by doubling: at most 16 bytes a pod with its empty slots.
    assert!(
        each <= own + 40,
        "the pod cache holds {each} bytes per pod, {} more than the pod itself",
        each - own
    );
    drop((store, writer));
}
