//! Unit tests of the builders: a table per spec field.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use memcached_api::{MemcachedConfig, MemcachedSpec, TopologySpread};

use super::*;

fn sample(size: i32) -> Memcached {
    let mut mc = Memcached::new("memcached-sample", MemcachedSpec::with_size(size));
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some("uid-1".into());
    mc
}

fn container(d: &Deployment) -> &Container {
    &d.spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod spec")
        .containers[0]
}

#[test]
fn seed_sample_makes_the_seed_deployment() {
    let d = desired_deployment(&sample(3), &BuildSettings::default()).expect("builds");
    assert_eq!(d.metadata.name.as_deref(), Some("memcached-sample"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let c = container(&d);
    assert_eq!(c.name, "memcached");
    assert_eq!(c.image.as_deref(), Some(memcached_api::DEFAULT_IMAGE));
    assert_eq!(
        c.command.as_deref(),
        Some(
            &[
                "memcached",
                "-m",
                "64",
                "-c",
                "1024",
                "-t",
                "4",
                "-I",
                "1m",
                "-p",
                "11211",
                "-o",
                "modern",
                "-v"
            ]
            .map(String::from)[..]
        )
    );
    let port = &c.ports.as_ref().expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("memcached"), 11211)
    );
}

#[test]
fn owner_reference_is_a_blocking_controller_reference() {
    let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
    let owners = d.metadata.owner_references.expect("owner refs");
    assert_eq!(owners.len(), 1);
    let o = &owners[0];
    assert_eq!(o.api_version, "memcached.cache.example.com/v1");
    assert_eq!(o.kind, "Memcached");
    assert_eq!(o.uid, "uid-1");
    assert_eq!(
        (o.controller, o.block_owner_deletion),
        (Some(true), Some(true))
    );
}

#[test]
fn pods_run_restricted() {
    let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
    let pod = d
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod");
    let psc = pod.security_context.as_ref().expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let sc = container(&d)
        .security_context
        .as_ref()
        .expect("container security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert!(sc.run_as_user.is_some_and(|uid| uid != 0));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    let c = container(&d);
    assert!(c.readiness_probe.is_some() && c.liveness_probe.is_some());
    assert!(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some()
    );
}

#[test]
fn selector_is_stable_and_a_subset_of_pod_labels() {
    let d = desired_deployment(&sample(1), &BuildSettings::default()).expect("builds");
    let spec = d.spec.as_ref().expect("spec");
    let selector = spec.selector.match_labels.clone().expect("match labels");
    assert_eq!(
        selector,
        BTreeMap::from([
            (
                "app.kubernetes.io/instance".to_string(),
                "memcached-sample".to_string()
            ),
            (
                "app.kubernetes.io/name".to_string(),
                "memcached".to_string()
            ),
        ])
    );
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .expect("labels");
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert_eq!(
        pod_labels.get(LABEL_MANAGED_BY).map(String::as_str),
        Some(MANAGED_BY)
    );
    assert_eq!(
        selector_string("memcached-sample"),
        "app.kubernetes.io/instance=memcached-sample,app.kubernetes.io/name=memcached"
    );
}

#[test]
fn image_and_port_follow_the_spec_and_settings() {
    let settings = BuildSettings {
        default_image: "registry.local/memcached:1.6".into(),
        ..BuildSettings::default()
    };
    let mut mc = sample(2);
    let d = desired_deployment(&mc, &settings).expect("builds");
    assert_eq!(
        container(&d).image.as_deref(),
        Some("registry.local/memcached:1.6")
    );
    mc.spec.image = Some("memcached:1.6.38".into());
    mc.spec.container_port = 11311;
    let d = desired_deployment(&mc, &settings).expect("builds");
    assert_eq!(container(&d).image.as_deref(), Some("memcached:1.6.38"));
    assert!(
        container(&d)
            .command
            .as_ref()
            .expect("command")
            .windows(2)
            .any(|w| w == ["-p", "11311"])
    );
    let s = desired_service(&mc).expect("builds");
    let port = &s
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .expect("ports")[0];
    assert_eq!(port.port, 11311);
    assert_eq!(
        port.target_port,
        Some(IntOrString::String("memcached".into()))
    );
}

#[test]
fn service_selects_the_pods_on_port_11211() {
    let s = desired_service(&sample(3)).expect("builds");
    let spec = s.spec.expect("spec");
    assert_eq!(spec.selector, Some(selector_labels("memcached-sample")));
    assert_eq!(spec.ports.expect("ports")[0].port, 11211);
    assert_eq!(s.metadata.owner_references.map(|o| o.len()), Some(1));
}

#[test]
fn an_object_without_uid_is_an_error_not_a_panic() {
    let mut mc = sample(1);
    mc.metadata.uid = None;
    assert_eq!(
        desired_service(&mc).err(),
        Some(BuildError::MissingMetadata("uid"))
    );
}

fn with_spec(edit: impl FnOnce(&mut memcached_api::MemcachedSpec)) -> Memcached {
    let mut mc = sample(3);
    edit(&mut mc.spec);
    mc
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod spec")
}

fn deployment(mc: &Memcached) -> Deployment {
    desired_deployment(mc, &BuildSettings::default()).expect("builds")
}

fn config(edit: impl FnOnce(&mut MemcachedConfig)) -> Option<MemcachedConfig> {
    let mut c = MemcachedConfig::default();
    edit(&mut c);
    Some(c)
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

#[test]
fn every_tuning_field_becomes_its_flag() {
    // (what changed, the config, the flag, its value)
    let cases: Vec<(&str, Option<MemcachedConfig>, &str, &str)> = vec![
        ("defaults", None, "-m", "64"),
        ("defaults", None, "-c", "1024"),
        ("defaults", None, "-t", "4"),
        ("defaults", None, "-I", "1m"),
        ("memory", config(|c| c.memory_mib = 2048), "-m", "2048"),
        (
            "connections",
            config(|c| c.max_connections = 4096),
            "-c",
            "4096",
        ),
        ("threads", config(|c| c.threads = 8), "-t", "8"),
        (
            "item size",
            config(|c| c.max_item_size = "4m".into()),
            "-I",
            "4m",
        ),
    ];
    for (what, cfg, flag, value) in cases {
        let mc = with_spec(|s| s.config = cfg);
        let args = container(&deployment(&mc))
            .command
            .clone()
            .expect("command");
        assert!(
            has_pair(&args, flag, value),
            "{what}: {flag} {value} in {args:?}"
        );
        assert_eq!(args[0], "memcached");
    }
}

#[test]
fn verbosity_and_extra_args() {
    for (level, flag) in [
        (0, None),
        (1, Some("-v")),
        (2, Some("-vv")),
        (3, Some("-vvv")),
    ] {
        let args = memcached_args(
            &config(|c| c.verbosity = level).expect("config"),
            11211,
            false,
            false,
        );
        let verbose: Vec<&String> = args.iter().filter(|a| a.starts_with("-v")).collect();
        assert_eq!(
            verbose.first().map(|s| s.as_str()),
            flag,
            "verbosity {level}"
        );
        assert!(verbose.len() <= 1);
    }
    let args = memcached_args(
        &config(|c| c.extra_args = vec!["-o".into(), "lru_crawler".into()]).expect("config"),
        11211,
        false,
        false,
    );
    assert_eq!(
        &args[args.len() - 2..],
        ["-o", "lru_crawler"],
        "extra args come last"
    );
}

#[test]
fn container_memory_follows_the_cache_size_unless_resources_are_given() {
    // The cache, a quarter, 48 MiB and 5 KiB for each of the 1024 connections (5 MiB).
    for (cache, want) in [(64, "133Mi"), (1024, "1333Mi"), (8, "63Mi")] {
        let mc = with_spec(|s| s.config = config(|c| c.memory_mib = cache));
        let r = container(&deployment(&mc))
            .resources
            .clone()
            .expect("resources");
        let req = r.requests.expect("requests");
        let lim = r.limits.expect("limits");
        assert_eq!(
            req.get("memory").map(|q| q.0.as_str()),
            Some(want),
            "cache {cache}"
        );
        assert_eq!(lim.get("memory"), req.get("memory"), "request = limit");
        assert!(
            !lim.contains_key("cpu"),
            "no CPU limit (throttling hurts latency)"
        );
    }
    // With TLS each connection's buffers are 32 KiB: 32 MiB for 1024.
    let tls = with_spec(|s| s.tls = Some(memcached_api::TlsSpec::secret("certs")));
    let memory = container(&deployment(&tls))
        .resources
        .clone()
        .and_then(|r| r.limits)
        .and_then(|l| l.get("memory").cloned());
    assert_eq!(memory, Some(Quantity("160Mi".into())));
    let custom = ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("1Gi".into()),
        )])),
        ..ResourceRequirements::default()
    };
    let mc = with_spec(|s| s.resources = Some(custom.clone()));
    assert_eq!(container(&deployment(&mc)).resources, Some(custom));
}

#[test]
fn scheduling_fields_pass_through() {
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, Toleration};
    let tolerations = vec![Toleration {
        key: Some("dedicated".into()),
        operator: Some("Equal".into()),
        value: Some("cache".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }];
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity::default()),
        ..Affinity::default()
    };
    let mc = with_spec(|s| {
        s.node_selector = Some(BTreeMap::from([("pool".into(), "cache".into())]));
        s.tolerations = Some(tolerations.clone());
        s.affinity = Some(Box::new(affinity.clone()));
        s.priority_class_name = Some("high".into());
        s.pod_annotations = Some(BTreeMap::from([("team".into(), "infra".into())]));
        s.pod_labels = Some(BTreeMap::from([
            ("tier".into(), "gold".into()),
            (LABEL_INSTANCE.into(), "hijack".into()),
        ]));
    });
    let d = deployment(&mc);
    let pod = pod_spec(&d);
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|n| n.get("pool"))
            .map(String::as_str),
        Some("cache")
    );
    assert_eq!(pod.tolerations.as_ref(), Some(&tolerations));
    assert_eq!(pod.affinity.as_ref(), Some(&affinity));
    assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
    let meta = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .expect("template meta");
    let labels = meta.labels.expect("labels");
    assert_eq!(labels.get("tier").map(String::as_str), Some("gold"));
    assert_eq!(
        labels.get(LABEL_INSTANCE).map(String::as_str),
        Some("memcached-sample"),
        "the operator's selector labels win"
    );
    let annotations = meta.annotations.expect("annotations");
    assert_eq!(annotations.get("team").map(String::as_str), Some("infra"));
    assert!(annotations.contains_key(CONFIG_HASH_ANNOTATION));
}

#[test]
fn topology_spread_by_policy() {
    // (policy, [hostname rule, zone rule])
    let cases = [
        (None, Some(["ScheduleAnyway", "ScheduleAnyway"])),
        (
            Some(TopologySpread::Preferred),
            Some(["ScheduleAnyway", "ScheduleAnyway"]),
        ),
        (
            Some(TopologySpread::Required),
            Some(["DoNotSchedule", "ScheduleAnyway"]),
        ),
        (Some(TopologySpread::Disabled), None),
    ];
    for (policy, when) in cases {
        let mc = with_spec(|s| s.topology_spread = policy);
        let d = deployment(&mc);
        let constraints = pod_spec(&d).topology_spread_constraints.clone();
        match when {
            None => assert!(constraints.is_none(), "{policy:?}"),
            Some(when) => {
                let c = constraints.expect("constraints");
                let keys: Vec<&str> = c.iter().map(|c| c.topology_key.as_str()).collect();
                assert_eq!(
                    keys,
                    ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
                );
                let rules: Vec<&str> = c.iter().map(|c| c.when_unsatisfiable.as_str()).collect();
                assert_eq!(rules, when, "{policy:?}");
                assert!(c.iter().all(|c| c.max_skew == 1));
                assert!(c.iter().all(|c| {
                    c.label_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.clone())
                        == Some(selector_labels("memcached-sample"))
                }));
            }
        }
    }
}

#[test]
fn rolling_updates_never_drop_below_size_ready_pods() {
    let d = deployment(&sample(3));
    let strategy = d.spec.and_then(|s| s.strategy).expect("strategy");
    let rolling = strategy.rolling_update.expect("rolling update");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
}

#[test]
fn pdb_only_from_two_pods() {
    for (size, want) in [(0, false), (1, false), (2, true), (5, true)] {
        let pdb = desired_pdb(&sample(size)).expect("builds");
        assert_eq!(pdb.is_some(), want, "size {size}");
        if let Some(pdb) = pdb {
            let spec = pdb.spec.expect("spec");
            assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
            assert_eq!(
                spec.selector.and_then(|s| s.match_labels),
                Some(selector_labels("memcached-sample"))
            );
        }
    }
}

#[test]
fn headless_service_exposes_pod_addresses() {
    let s = desired_headless_service(&with_spec(|s| {
        s.exporter = Some(memcached_api::ExporterSpec {
            enabled: true,
            image: None,
        })
    }))
    .expect("builds");
    assert_eq!(
        s.metadata.name.as_deref(),
        Some("memcached-sample-headless")
    );
    assert_eq!(
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_INSTANCE))
            .map(String::as_str),
        Some("memcached-sample"),
        "labelled for the Memcached, not for its own name"
    );
    let spec = s.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    let ports: Vec<i32> = spec.ports.expect("ports").iter().map(|p| p.port).collect();
    assert_eq!(
        ports,
        [11211],
        "memcached only; metrics are scraped via the client Service"
    );
}

#[test]
fn exporter_sidecar_port_and_monitor_only_when_enabled() {
    let off = sample(2);
    assert_eq!(pod_spec(&deployment(&off)).containers.len(), 1);
    assert_eq!(
        desired_service(&off)
            .expect("svc")
            .spec
            .and_then(|s| s.ports)
            .map(|p| p.len()),
        Some(1)
    );
    assert!(desired_service_monitor(&off).expect("builds").is_none());

    let on = with_spec(|s| {
        s.exporter = Some(memcached_api::ExporterSpec {
            enabled: true,
            image: Some("registry.local/exporter:v1".into()),
        })
    });
    let d = deployment(&on);
    let exporter = &pod_spec(&d).containers[1];
    assert_eq!(exporter.name, EXPORTER_NAME);
    assert_eq!(
        exporter.image.as_deref(),
        Some("registry.local/exporter:v1")
    );
    assert_eq!(
        exporter.ports.as_ref().expect("ports")[0].container_port,
        EXPORTER_PORT
    );
    assert!(
        exporter
            .args
            .as_ref()
            .expect("args")
            .contains(&"--memcached.address=localhost:11211".to_string())
    );
    assert_eq!(
        exporter
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem),
        Some(true)
    );
    let ports = desired_service(&on)
        .expect("svc")
        .spec
        .and_then(|s| s.ports)
        .expect("ports");
    assert_eq!(ports[1].name.as_deref(), Some(METRICS_PORT_NAME));
    let monitor = desired_service_monitor(&on)
        .expect("builds")
        .expect("monitor");
    // Its JSON, and so its applied-hash annotation, is what earlier releases applied
    // as an untyped object: upgrading the operator rewrites no ServiceMonitor.
    let before = serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": child_metadata(&on, "memcached-sample").expect("metadata"),
        "spec": {
            "selector": {"matchLabels": labels("memcached-sample")},
            "endpoints": [{"port": METRICS_PORT_NAME, "interval": "30s"}],
        },
    });
    assert_eq!(
        crate::drift::desired_hash(&monitor),
        crate::drift::desired_hash(&before)
    );
    let monitor = serde_json::to_value(&monitor).expect("json");
    assert_eq!(monitor["kind"], "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], METRICS_PORT_NAME);
    assert_eq!(monitor["metadata"]["ownerReferences"][0]["uid"], "uid-1");
}

#[test]
fn sasl_and_tls_mount_their_secrets_and_set_flags() {
    let mc = with_spec(|s| {
        s.sasl = Some(memcached_api::SaslSpec {
            secret_name: "auth".into(),
        });
        s.tls = Some(memcached_api::TlsSpec {
            secret_name: "certs".into(),
            rotation: None,
            client_auth: None,
        });
    });
    let d = deployment(&mc);
    let c = container(&d);
    let args = c.command.clone().expect("command");
    assert!(args.contains(&"-S".to_string()));
    assert!(args.contains(&"-Z".to_string()));
    assert!(
        args.iter()
            .any(|a| a.starts_with("ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key="))
    );
    let env = c.env.clone().expect("env");
    assert_eq!(env[0].name, "MEMCACHED_SASL_PWDB");
    assert_eq!(
        env[0].value.as_deref(),
        Some("/etc/memcached/sasl/sasl-pwdb")
    );
    let volumes = pod_spec(&d).volumes.clone().expect("volumes");
    let secrets: Vec<Option<String>> = volumes
        .iter()
        .map(|v| {
            v.secret
                .as_ref()
                .and_then(|s| s.secret_name.clone())
                .or_else(|| {
                    v.projected
                        .as_ref()?
                        .sources
                        .iter()
                        .flatten()
                        .find_map(|p| Some(p.secret.as_ref()?.name.clone()))
                })
        })
        .collect();
    assert_eq!(
        secrets,
        [Some("auth".to_string()), Some("certs".to_string())]
    );
    let mounts = c.volume_mounts.clone().expect("mounts");
    assert!(mounts.iter().all(|m| m.read_only == Some(true)));

    // Who can read the mounted files, by the kubelet's rules: Secret files are owned by
    // root, with the pod's fsGroup as their group when it is set, and `defaultMode`.
    let pod = pod_spec(&d);
    let sc = pod.security_context.clone().expect("pod security context");
    let uid = sc.run_as_user.expect("runs as a fixed user");
    assert_ne!(uid, 0);
    let process_groups: Vec<i64> = sc.run_as_group.into_iter().chain(sc.fs_group).collect();
    for v in &volumes {
        let mode = v
            .secret
            .as_ref()
            .and_then(|s| s.default_mode)
            .or_else(|| v.projected.as_ref().and_then(|p| p.default_mode))
            .unwrap_or(0o644);
        let group_reads =
            sc.fs_group.is_some_and(|g| process_groups.contains(&g)) && mode & 0o040 != 0;
        let others_read = mode & 0o004 != 0;
        assert!(
            group_reads || others_read,
            "volume {} (mode {mode:o}) is unreadable by UID {uid} in groups {process_groups:?}",
            v.name
        );
        assert!(
            !others_read,
            "volume {}: secrets readable by every user",
            v.name
        );
    }
}

#[test]
fn the_config_hash_changes_with_the_config_and_rotated_secrets_only() {
    let hash = |mc: &Memcached, secrets: &SecretVersions| {
        desired_deployment_with(mc, &BuildSettings::default(), secrets)
            .expect("builds")
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("hash")
    };
    let base = sample(3);
    let none = SecretVersions::default();
    assert_eq!(
        hash(&base, &none),
        hash(&sample(5), &none),
        "size does not roll pods"
    );
    let tuned = with_spec(|s| s.config = config(|c| c.threads = 8));
    assert_ne!(hash(&base, &none), hash(&tuned, &none));
    let v1 = SecretVersions {
        sasl: Some("1".into()),
        ..SecretVersions::default()
    };
    let v2 = SecretVersions {
        sasl: Some("2".into()),
        ..SecretVersions::default()
    };
    assert_ne!(
        hash(&base, &v1),
        hash(&base, &v2),
        "a rotated Secret rolls the pods"
    );
}
fn template_hash(mc: &Memcached, tls_digest: &str) -> String {
    let secrets = SecretVersions {
        sasl: mc.spec.sasl.as_ref().map(|_| "sasl-1".to_string()),
        tls: Some(tls_digest.to_string()),
        ..SecretVersions::default()
    };
    let d = desired_deployment_with(mc, &BuildSettings::default(), &secrets).expect("builds");
    d.spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
        .expect("config hash")
}

fn tls(rotation: Option<memcached_api::TlsRotation>) -> Option<memcached_api::TlsSpec> {
    Some(memcached_api::TlsSpec {
        secret_name: "certs".into(),
        rotation,
        client_auth: None,
    })
}

#[test]
fn tls_in_place_runs_the_reload_agent_and_a_renewal_changes_no_template() {
    use memcached_api::TlsRotation;
    let mc = with_spec(|s| s.tls = tls(None));
    assert_eq!(template_hash(&mc, "cert-1"), template_hash(&mc, "cert-2"));
    let d = deployment(&mc);
    let pod = pod_spec(&d);
    let agents = pod.init_containers.as_ref().expect("the agent");
    assert_eq!(agents.len(), 1);
    let agent = &agents[0];
    assert_eq!(agent.name, "tls-reload-agent");
    // A native sidecar: an init container that keeps running beside memcached.
    assert_eq!(agent.restart_policy.as_deref(), Some("Always"));
    // Its own image and binary.
    assert_eq!(agent.image.as_deref(), Some("tls-agent:latest"));
    let command = agent.command.clone().expect("command");
    assert_eq!(command[0], "/memcached-tls-agent");
    assert!(command.contains(&"--admin-address=127.0.0.1:11299".to_string()));
    let mounts = agent.volume_mounts.clone().expect("mounts");
    assert_eq!(mounts[0].mount_path, "/etc/memcached/tls");
    // memcached: TLS on every address, plain text on loopback only for the agent.
    let args = container(&d).command.clone().expect("command");
    assert!(
        has_pair(&args, "-l", "*:11211,notls:127.0.0.1:11299"),
        "{args:?}"
    );

    // Restart, or SASL (binary protocol only: no refresh_certs), roll on a renewal.
    for mc in [
        with_spec(|s| s.tls = tls(Some(TlsRotation::Restart))),
        with_spec(|s| {
            s.tls = tls(None);
            s.sasl = Some(memcached_api::SaslSpec {
                secret_name: "auth".into(),
            });
        }),
    ] {
        assert_ne!(template_hash(&mc, "cert-1"), template_hash(&mc, "cert-2"));
        let d = deployment(&mc);
        assert_eq!(pod_spec(&d).init_containers, None);
        let args = container(&d).command.clone().expect("command");
        assert!(!args.iter().any(|a| a == "-l"), "{args:?}");
    }
    // Without TLS there is no agent.
    assert_eq!(pod_spec(&deployment(&sample(3))).init_containers, None);
}

#[test]
fn the_agent_image_follows_the_settings() {
    let settings = BuildSettings {
        tls_agent_image: "registry.local/memcached-operator:v1".into(),
        ..BuildSettings::default()
    };
    let mc = with_spec(|s| s.tls = tls(None));
    let d = desired_deployment(&mc, &settings).expect("builds");
    let agent = &pod_spec(&d).init_containers.as_ref().expect("agent")[0];
    assert_eq!(
        agent.image.as_deref(),
        Some("registry.local/memcached-operator:v1")
    );
}

#[test]
fn rollouts_wait_30_seconds_per_pod_unless_told_otherwise() {
    let min_ready = |mc: &Memcached| deployment(mc).spec.and_then(|s| s.min_ready_seconds);
    assert_eq!(min_ready(&sample(3)), Some(30));
    let mc = with_spec(|s| {
        s.rollout = Some(memcached_api::RolloutSpec {
            min_ready_seconds: 120,
            ..Default::default()
        })
    });
    assert_eq!(min_ready(&mc), Some(120));
}

/// The headroom is the volume's alone: memcached's `ext_path` and the pod's
/// `ephemeral-storage` request stay `size`, so a pool whose spec did not change keeps its
/// memcached container; a size that is no whole number of MiB rounds the volume up.
#[test]
fn extstore_headroom_is_in_the_volume_only() {
    let mc = with_spec(|s| {
        s.extstore = Some(Box::new(memcached_api::ExtstoreSpec {
            size: "10G".into(),
            page_size_mib: 2,
            write_buffer_mib: 2,
            ..memcached_api::ExtstoreSpec::default()
        }))
    });
    let d = deployment(&mc);
    let option = container(&d)
        .command
        .iter()
        .flatten()
        .find(|a| a.contains("ext_path="))
        .cloned()
        .expect("ext_path");
    // 10^10 bytes: 9536 whole MiB.
    assert!(option.ends_with(":9536m"), "{option}");
    let requests = container(&d)
        .resources
        .clone()
        .and_then(|r| r.requests)
        .expect("requests");
    assert_eq!(
        requests.get("ephemeral-storage"),
        Some(&Quantity("10G".into()))
    );
    let volume = pod_spec(&d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "extstore")
        .cloned()
        .expect("extstore volume");
    // 2 × 10^10 bytes and a MiB, rounded up to MiB.
    assert_eq!(
        volume.empty_dir.and_then(|e| e.size_limit),
        Some(Quantity("19075Mi".into()))
    );
    assert_eq!(
        extstore_claim(&with_spec(|s| {
            s.extstore = Some(Box::new(memcached_api::ExtstoreSpec {
                size: "10G".into(),
                storage_class_name: Some("fast".into()),
                page_size_mib: 2,
                write_buffer_mib: 2,
                ..memcached_api::ExtstoreSpec::default()
            }))
        })),
        // 10^10 bytes, an eighth of them and 64 MiB, rounded up to MiB.
        Some(Quantity("10793Mi".into()))
    );
}

fn extstore_claim(mc: &Memcached) -> Option<Quantity> {
    let d = deployment(mc);
    pod_spec(&d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "extstore")?
        .ephemeral
        .as_ref()?
        .volume_claim_template
        .as_ref()?
        .spec
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

#[test]
fn extstore_adds_its_volume_flags_and_memory() {
    let mc = with_spec(|s| s.extstore = Some(Box::new(memcached_api::ExtstoreSpec::default())));
    let d = deployment(&mc);
    let args = container(&d).command.clone().expect("command");
    assert!(
        has_pair(
            &args,
            "-o",
            "ext_page_size=64,ext_wbuf_size=4,ext_threads=1,ext_item_size=512,ext_path=/var/lib/memcached/extstore/data:1024m"
        ),
        "{args:?}"
    );
    let volume = pod_spec(&d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "extstore")
        .expect("extstore volume");
    // Twice the file and a MiB: a full file on XFS holds up to twice its size for minutes
    // (tests/real_memcached_warm.rs fills one), and the kubelet evicts past the limit.
    assert_eq!(
        volume.empty_dir.as_ref().and_then(|e| e.size_limit.clone()),
        Some(Quantity("2049Mi".into()))
    );
    let mount = container(&d)
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "extstore")
        .expect("mounted");
    assert_eq!(mount.mount_path, "/var/lib/memcached/extstore");
    assert_ne!(mount.read_only, Some(true));
    // 64 MiB of cache + 25 % + 48 MiB + 5 MiB of connections, and six 4 MiB write
    // buffers: 157 MiB.
    let resources = container(&d).resources.clone().expect("resources");
    let requests = resources.requests.expect("requests");
    assert_eq!(requests.get("memory"), Some(&Quantity("157Mi".into())));
    assert_eq!(
        requests.get("ephemeral-storage"),
        Some(&Quantity("1Gi".into()))
    );
    assert_eq!(
        resources.limits.expect("limits").get("memory"),
        Some(&Quantity("157Mi".into()))
    );

    // With a StorageClass: a generic ephemeral volume of that class, off the node's disk.
    let mc = with_spec(|s| {
        s.extstore = Some(Box::new(memcached_api::ExtstoreSpec {
            size: "20Gi".into(),
            storage_class_name: Some("fast-ssd".into()),
            page_size_mib: 32,
            write_buffer_mib: 8,
            threads: 4,
            item_size_bytes: 1024,
            item_age_seconds: Some(600),
            enabled: true,
        }))
    });
    let d = deployment(&mc);
    let args = container(&d).command.clone().expect("command");
    assert!(
        has_pair(
            &args,
            "-o",
            "ext_page_size=32,ext_wbuf_size=8,ext_threads=4,ext_item_size=1024,ext_item_age=600,ext_path=/var/lib/memcached/extstore/data:20480m"
        ),
        "{args:?}"
    );
    let volume = pod_spec(&d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "extstore")
        .expect("extstore volume");
    let claim = volume
        .ephemeral
        .as_ref()
        .and_then(|e| e.volume_claim_template.as_ref())
        .expect("claim template");
    assert_eq!(claim.spec.storage_class_name.as_deref(), Some("fast-ssd"));
    assert_eq!(
        claim
            .spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
        // 20 GiB, an eighth of it and 64 MiB: what the filesystem keeps for itself.
        Some(&Quantity("23104Mi".into()))
    );
    let requests = container(&d)
        .resources
        .clone()
        .and_then(|r| r.requests)
        .expect("requests");
    assert_eq!(requests.get("ephemeral-storage"), None);
    assert_eq!(requests.get("memory"), Some(&Quantity("181Mi".into())));

    // Off: nothing of it.
    let mc = with_spec(|s| {
        s.extstore = Some(Box::new(memcached_api::ExtstoreSpec {
            enabled: false,
            ..memcached_api::ExtstoreSpec::default()
        }))
    });
    let d = deployment(&mc);
    assert!(
        !container(&d)
            .command
            .iter()
            .flatten()
            .any(|a| a.contains("ext_"))
    );
    assert!(
        !pod_spec(&d)
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "extstore")
    );
}

#[test]
fn image_pull_secrets_reach_every_pod() {
    let mc = with_spec(|s| {
        s.image_pull_secrets = Some(vec![k8s_openapi::api::core::v1::LocalObjectReference {
            name: "registry-credentials".into(),
        }]);
        s.proxy = Some(Box::new(memcached_api::ProxySpec::default()));
    });
    let names = |pod: &PodSpec| {
        pod.image_pull_secrets
            .iter()
            .flatten()
            .map(|r| r.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(pod_spec(&deployment(&mc))), ["registry-credentials"]);
    let proxy = crate::proxy::desired_proxy_deployment(&mc, &BuildSettings::default())
        .expect("builds")
        .expect("the proxy");
    assert_eq!(names(pod_spec(&proxy)), ["registry-credentials"]);
    assert!(names(pod_spec(&deployment(&sample(3)))).is_empty());
}

#[test]
fn secret_volumes_mount_only_the_keys_memcached_reads() {
    let mc = with_spec(|s| {
        s.sasl = Some(memcached_api::SaslSpec {
            secret_name: "auth".into(),
        });
        s.tls = Some(memcached_api::TlsSpec::secret("certs"));
    });
    let d = deployment(&mc);
    let keys = |name: &str| {
        pod_spec(&d)
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| {
                v.secret.as_ref().and_then(|s| s.items.clone()).or_else(|| {
                    v.projected
                        .as_ref()?
                        .sources
                        .iter()
                        .flatten()
                        .find_map(|p| p.secret.as_ref()?.items.clone())
                })
            })
            .unwrap_or_default()
            .into_iter()
            .map(|i| (i.key, i.path))
            .collect::<Vec<_>>()
    };
    let pair = |k: &str| (k.to_string(), k.to_string());
    assert_eq!(keys("tls"), [pair("tls.crt"), pair("tls.key")]);
    assert_eq!(keys("sasl"), [pair("sasl-pwdb")]);
}

#[test]
fn sasl_gives_memcached_a_configuration_with_plain_only() {
    let mc = with_spec(|s| {
        s.sasl = Some(memcached_api::SaslSpec {
            secret_name: "auth".into(),
        });
    });
    let d = deployment(&mc);
    let pod = pod_spec(&d);
    let memcached = &pod.containers[0];
    let env = |name: &str| {
        memcached
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    // memcached reads SASL_CONF_PATH/memcached.conf: the `sasl` volume's mount.
    let dir = env(SASL_CONF_PATH_ENV).expect("SASL_CONF_PATH");
    let mounted = memcached
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == dir)
        .expect("a mount at SASL_CONF_PATH");
    assert_eq!(mounted.name, "sasl");
    assert_eq!(
        env("MEMCACHED_SASL_PWDB"),
        Some(format!("{dir}/{SASL_PWDB_KEY}"))
    );
    // Its memcached.conf is the pod's annotation, which offers PLAIN alone.
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "sasl")
        .expect("sasl volume");
    let file = volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.as_ref())
        .into_iter()
        .flatten()
        .find_map(|p| p.downward_api.as_ref()?.items.clone())
        .into_iter()
        .flatten()
        .find(|f| f.path == "memcached.conf")
        .expect("memcached.conf");
    let field = file.field_ref.expect("fieldRef").field_path;
    assert_eq!(
        field,
        format!("metadata.annotations['{SASL_CONF_ANNOTATION}']")
    );
    let annotations = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(
        annotations
            .get(SASL_CONF_ANNOTATION)
            .map(|v| v.lines().collect::<Vec<_>>()),
        Some(vec!["mech_list: plain"])
    );
    // Without SASL, none of it.
    let plain = deployment(&with_spec(|_| {}));
    assert!(pod_spec(&plain).containers[0].env.is_none());
}

fn proxied(edit: impl FnOnce(&mut MemcachedSpec)) -> Memcached {
    let mut mc = sample(3);
    mc.spec.proxy = Some(Box::new(memcached_api::ProxySpec::default()));
    edit(&mut mc.spec);
    mc
}

/// The memcached pods' and the proxy pods' specs of `mc`.
fn pool_and_proxy_pods(mc: &Memcached) -> [PodSpec; 2] {
    let settings = BuildSettings::default();
    let pod = |d: Deployment| pod_spec(&d).clone();
    [
        pod(desired_deployment(mc, &settings).expect("builds")),
        pod(crate::proxy::desired_proxy_deployment(mc, &settings)
            .expect("builds")
            .expect("the proxy runs")),
    ]
}

#[test]
fn unset_stop_and_security_settings_leave_the_pods_as_they_were() {
    // Pools that set none of these must keep their pod templates through an upgrade.
    for pod in pool_and_proxy_pods(&proxied(|_| {})) {
        assert_eq!(pod.termination_grace_period_seconds, None);
        assert!(pod.containers.iter().all(|c| c.lifecycle.is_none()));
        let context = pod.security_context.as_ref().expect("pod context");
        assert_eq!(context.run_as_user, Some(MEMCACHED_UID));
        assert!(pod.containers.iter().all(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .is_some()
        }));
    }
}

#[test]
fn graceful_shutdown_delays_memcached_and_the_proxy_within_the_grace_period() {
    let mc = proxied(|s| {
        s.exporter = Some(memcached_api::ExporterSpec {
            enabled: true,
            image: None,
        });
        s.graceful_shutdown = Some(memcached_api::GracefulShutdownSpec {
            pre_stop_delay_seconds: 15,
            termination_grace_period_seconds: None,
        });
    });
    for pod in pool_and_proxy_pods(&mc) {
        // Unset, the grace period is the delay and Kubernetes' 30 s after it.
        assert_eq!(pod.termination_grace_period_seconds, Some(45));
        let sleep = |c: &Container| {
            c.lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .and_then(|h| h.sleep.as_ref())
                .map(|s| s.seconds)
        };
        // The container that serves clients waits; a helper (the exporter) does not.
        assert_eq!(sleep(&pod.containers[0]), Some(15));
        assert!(pod.containers[1..].iter().all(|c| sleep(c).is_none()));
    }
    let [pool, _] = pool_and_proxy_pods(&proxied(|s| {
        s.graceful_shutdown = Some(memcached_api::GracefulShutdownSpec {
            pre_stop_delay_seconds: 0,
            termination_grace_period_seconds: Some(120),
        })
    }));
    assert_eq!(pool.termination_grace_period_seconds, Some(120));
    assert!(pool.containers[0].lifecycle.is_none(), "no delay, no hook");
}

#[test]
fn security_overrides_replace_only_the_fields_they_set() {
    use k8s_openapi::api::core::v1::{
        Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
    };
    let mc = proxied(|s| {
        s.tls = None;
        s.pod_security_context = Some(Box::new(PodSecurityContext {
            run_as_user: Some(1_000_680_000),
            fs_group: Some(1_000_680_000),
            ..PodSecurityContext::default()
        }));
        s.container_security_context = Some(Box::new(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_BIND_SERVICE".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "Localhost".into(),
                localhost_profile: Some("memcached.json".into()),
            }),
            ..SecurityContext::default()
        }));
    });
    for pod in pool_and_proxy_pods(&mc) {
        let context = pod.security_context.as_ref().expect("pod context");
        assert_eq!(context.run_as_user, Some(1_000_680_000));
        assert_eq!(context.fs_group, Some(1_000_680_000));
        // What the override leaves unset stays the operator's.
        assert_eq!(context.run_as_non_root, Some(true));
        assert_eq!(
            context.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        for c in &pod.containers {
            let context = c.security_context.as_ref().expect("container context");
            // The pod's UID applies: the container's own is gone.
            assert_eq!(context.run_as_user, None, "{}", c.name);
            assert_eq!(
                context.capabilities.as_ref().and_then(|c| c.add.clone()),
                Some(vec!["NET_BIND_SERVICE".to_string()])
            );
            assert_eq!(context.allow_privilege_escalation, Some(false));
            assert_eq!(context.read_only_root_filesystem, Some(true));
            assert_eq!(
                context
                    .seccomp_profile
                    .as_ref()
                    .and_then(|p| p.localhost_profile.as_deref()),
                Some("memcached.json")
            );
        }
    }
}

#[test]
fn service_metadata_reaches_every_client_service_and_the_operators_labels_win() {
    let mc = proxied(|s| {
        s.service = Some(Box::new(memcached_api::ServiceMetadataSpec {
            annotations: Some(
                [(
                    "service.beta.kubernetes.io/aws-load-balancer-internal".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            labels: Some(
                [
                    ("team".to_string(), "cache".to_string()),
                    (LABEL_INSTANCE.to_string(), "someone-else".to_string()),
                ]
                .into(),
            ),
        }))
    });
    let services = [
        desired_service(&mc).expect("builds"),
        desired_cluster_ip_service(&mc).expect("builds"),
        desired_headless_service(&mc).expect("builds"),
        crate::proxy::desired_proxy_service(&mc)
            .expect("builds")
            .expect("the proxy runs"),
    ];
    for service in services {
        let meta = &service.metadata;
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels.get("team").map(String::as_str), Some("cache"));
        assert_eq!(
            labels.get(LABEL_INSTANCE).map(String::as_str),
            Some("memcached-sample")
        );
        assert_eq!(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get("service.beta.kubernetes.io/aws-load-balancer-internal"))
                .map(String::as_str),
            Some("true")
        );
    }
    // Neither reaches the pods, the budget or the Deployment.
    let d = desired_deployment(&mc, &BuildSettings::default()).expect("builds");
    assert!(
        d.metadata
            .labels
            .as_ref()
            .expect("labels")
            .get("team")
            .is_none()
    );
    assert!(d.metadata.annotations.is_none());
}

#[test]
fn client_authentication_mounts_the_ca_and_rolls_only_for_a_new_ca() {
    let with_auth = |ca_secret: Option<&str>, verify| {
        with_spec(|s| {
            s.tls = Some(memcached_api::TlsSpec {
                client_auth: Some(memcached_api::ClientAuthSpec {
                    ca_secret_name: ca_secret.map(String::from),
                    verify,
                }),
                ..memcached_api::TlsSpec::secret("certs")
            })
        })
    };
    let mc = with_auth(None, None);
    let d = deployment(&mc);
    let command = container(&d).command.clone().expect("command");
    assert!(
        command.windows(2).any(|w| w
            == [
                "-o",
                "ssl_ca_cert=/etc/memcached/tls/ca.crt,ssl_verify_mode=2"
            ]),
        "{command:?}"
    );
    let optional = deployment(&with_auth(
        None,
        Some(memcached_api::ClientVerify::Optional),
    ));
    assert!(
        container(&optional)
            .command
            .iter()
            .flatten()
            .any(|a| a.ends_with("ssl_verify_mode=1"))
    );
    let volume = |d: &Deployment| {
        pod_spec(d)
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "tls")
            .cloned()
            .expect("the tls volume")
    };
    // The CA of the TLS Secret is mounted beside the certificate.
    let items: Vec<_> = volume(&d)
        .secret
        .and_then(|s| s.items)
        .expect("items")
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(items, ["tls.crt", "tls.key", "ca.crt"]);
    // A CA of its own comes through a projected volume, into the same directory.
    let own = volume(&deployment(&with_auth(Some("client-ca"), None)));
    let sources = own.projected.and_then(|p| p.sources).expect("sources");
    let names: Vec<_> = sources
        .iter()
        .filter_map(|s| s.secret.as_ref())
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, ["certs", "client-ca"]);
    // Without client authentication nothing changes: the Secret's two keys only.
    let plain = deployment(&with_spec(|s| {
        s.tls = Some(memcached_api::TlsSpec::secret("certs"))
    }));
    assert_eq!(
        volume(&plain).secret.and_then(|s| s.items).map(|i| i.len()),
        Some(2)
    );

    // A renewed server certificate reloads in place; a new CA rolls the pods (memcached
    // keeps trusting a CA taken out of ca.crt until it restarts).
    let hash = |tls: &str, ca: &str| {
        let secrets = SecretVersions {
            tls: Some(tls.into()),
            client_ca: Some(ca.into()),
            ..SecretVersions::default()
        };
        let d = desired_deployment_with(&mc, &BuildSettings::default(), &secrets).expect("builds");
        d.spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("config hash")
    };
    assert_eq!(hash("cert-1", "ca-1"), hash("cert-2", "ca-1"));
    assert_ne!(hash("cert-1", "ca-1"), hash("cert-1", "ca-2"));
}

/// Whether `policy` (in namespace `ns`) admits a peer of `pod_labels` in a namespace of
/// `ns_labels` named `peer_ns` to `port`, by NetworkPolicy's rules as the API documents them
/// (a peer's podSelector alone means the policy's namespace; with a namespaceSelector, the
/// namespaces it selects; matchLabels only, as these builders write). No CNI enforces
/// policies on the test machines, so this reading of the rules is the test's own.
fn admits(
    policy: &k8s_openapi::api::networking::v1::NetworkPolicy,
    peer_ns: &str,
    ns_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
    port: i32,
) -> bool {
    let selects = |selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                   labels: &BTreeMap<String, String>| {
        selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    let policy_ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let spec = policy.spec.as_ref().expect("spec");
    spec.ingress.iter().flatten().any(|rule| {
        let port_ok = rule.ports.iter().flatten().any(|p| {
            p.port == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port))
        });
        let peer_ok = rule.from.iter().flatten().any(|peer| {
            let ns_ok = match &peer.namespace_selector {
                Some(selector) => selects(selector, ns_labels),
                None => peer_ns == policy_ns,
            };
            let pod_ok = peer
                .pod_selector
                .as_ref()
                .is_none_or(|s| selects(s, pod_labels));
            peer.ip_block.is_none() && ns_ok && pod_ok
        });
        port_ok && peer_ok
    })
}

#[test]
fn the_network_policies_admit_the_clients_the_proxy_and_the_scrapers_only() {
    use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let selector = |pairs: &[(&str, &str)]| LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    };
    let mc = proxied(|s| {
        s.exporter = Some(memcached_api::ExporterSpec {
            enabled: true,
            image: None,
        });
        s.network_policy = Some(Box::new(memcached_api::NetworkPolicySpec {
            enabled: true,
            // The web pods of this namespace, and any pod of the `batch` namespaces.
            from: vec![
                NetworkPolicyPeer {
                    pod_selector: Some(selector(&[("app", "web")])),
                    ..NetworkPolicyPeer::default()
                },
                NetworkPolicyPeer {
                    namespace_selector: Some(selector(&[("tier", "batch")])),
                    ..NetworkPolicyPeer::default()
                },
            ],
            metrics_from: vec![NetworkPolicyPeer {
                namespace_selector: Some(selector(&[(
                    "kubernetes.io/metadata.name",
                    "monitoring",
                )])),
                pod_selector: Some(selector(&[("app.kubernetes.io/name", "prometheus")])),
                ..NetworkPolicyPeer::default()
            }],
        }));
    });
    let pool = desired_network_policy(&mc)
        .expect("builds")
        .expect("enabled");
    let proxy = crate::proxy::desired_proxy_network_policy(&mc)
        .expect("builds")
        .expect("enabled with the proxy");
    assert_eq!(
        pool.spec.as_ref().and_then(|s| s.pod_selector.clone()),
        Some(selector(&[
            ("app.kubernetes.io/name", "memcached"),
            ("app.kubernetes.io/instance", "memcached-sample")
        ]))
    );
    let default_ns = labels(&[("kubernetes.io/metadata.name", "default")]);
    let batch_ns = labels(&[("tier", "batch")]);
    let monitoring = labels(&[("kubernetes.io/metadata.name", "monitoring")]);
    let web = labels(&[("app", "web")]);
    let prometheus = labels(&[("app.kubernetes.io/name", "prometheus")]);
    let own_proxy = crate::proxy::proxy_selector_labels("memcached-sample");
    let other_proxy = crate::proxy::proxy_selector_labels("another-pool");
    let nobody = labels(&[("app", "api")]);
    let shop_ns = labels(&[]);
    // (who, namespace, its labels, pod labels, port, pool admits, proxy admits)
    type Labels = BTreeMap<String, String>;
    type Row<'a> = (&'a str, &'a str, &'a Labels, &'a Labels, i32, bool, bool);
    let table: Vec<Row> = vec![
        ("a web pod", "default", &default_ns, &web, 11211, true, true),
        (
            "a web pod, at the metrics port",
            "default",
            &default_ns,
            &web,
            9150,
            false,
            false,
        ),
        (
            "a web pod of another namespace",
            "shop",
            &shop_ns,
            &web,
            11211,
            false,
            false,
        ),
        (
            "any pod of a batch namespace",
            "jobs",
            &batch_ns,
            &nobody,
            11211,
            true,
            true,
        ),
        (
            "another pod of this namespace",
            "default",
            &default_ns,
            &nobody,
            11211,
            false,
            false,
        ),
        (
            "the pool's own proxy",
            "default",
            &default_ns,
            &own_proxy,
            11211,
            true,
            false,
        ),
        (
            "another pool's proxy",
            "default",
            &default_ns,
            &other_proxy,
            11211,
            false,
            false,
        ),
        (
            "Prometheus, at the metrics port",
            "monitoring",
            &monitoring,
            &prometheus,
            9150,
            true,
            false,
        ),
        (
            "Prometheus, at memcached's port",
            "monitoring",
            &monitoring,
            &prometheus,
            11211,
            false,
            false,
        ),
        (
            "another pod of monitoring",
            "monitoring",
            &monitoring,
            &nobody,
            9150,
            false,
            false,
        ),
    ];
    for (who, ns, ns_labels, pod_labels, port, pool_admits, proxy_admits) in table {
        assert_eq!(
            admits(&pool, ns, ns_labels, pod_labels, port),
            pool_admits,
            "pool: {who}"
        );
        assert_eq!(
            admits(&proxy, ns, ns_labels, pod_labels, port),
            proxy_admits,
            "proxy: {who}"
        );
    }
    // Off: no policy; without the proxy, no proxy policy and no proxy peer.
    assert_eq!(desired_network_policy(&sample(3)).expect("builds"), None);
    let mut direct = mc.clone();
    direct.spec.proxy = None;
    assert_eq!(
        crate::proxy::desired_proxy_network_policy(&direct).expect("builds"),
        None
    );
    let pool = desired_network_policy(&direct)
        .expect("builds")
        .expect("enabled");
    assert!(!admits(&pool, "default", &default_ns, &own_proxy, 11211));
}

/// The HPA sizes the Memcached (its scale subresource, whose `spec.size` the operator turns
/// into the Deployment's replicas), from the memcached container's own use, and removes one
/// pod a minute after the window; without `spec.autoscaling` there is none.
#[test]
fn the_autoscaler_targets_the_memcached_on_the_memcached_containers_use() {
    assert_eq!(desired_hpa(&sample(3)).expect("builds"), None);
    let mut mc = sample(3);
    mc.spec.autoscaling = Some(memcached_api::AutoscalingSpec {
        min_replicas: 2,
        max_replicas: 8,
        target_cpu_utilization_percentage: Some(70),
        target_memory_utilization_percentage: Some(90),
        scale_down_stabilization_seconds: 900,
    });
    let hpa = desired_hpa(&mc).expect("builds").expect("autoscaled");
    assert_eq!(hpa.metadata.name.as_deref(), Some("memcached-sample"));
    let owner = &hpa.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Memcached", Some(true))
    );
    let spec = hpa.spec.expect("spec");
    assert_eq!(
        (
            spec.scale_target_ref.api_version.as_deref(),
            spec.scale_target_ref.kind.as_str(),
            spec.scale_target_ref.name.as_str()
        ),
        (
            Some("memcached.cache.example.com/v1"),
            "Memcached",
            "memcached-sample"
        )
    );
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 8));
    let targets: Vec<_> = spec
        .metrics
        .expect("metrics")
        .into_iter()
        .map(|m| {
            let c = m.container_resource.expect("a container's resource");
            (
                m.type_,
                c.container,
                c.name,
                c.target.type_,
                c.target.average_utilization,
            )
        })
        .collect();
    let t = |resource: &str, percent| {
        (
            "ContainerResource".to_string(),
            "memcached".to_string(),
            resource.to_string(),
            "Utilization".to_string(),
            Some(percent),
        )
    };
    assert_eq!(targets, vec![t("cpu", 70), t("memory", 90)]);
    let down = spec
        .behavior
        .and_then(|b| b.scale_down)
        .expect("scale-down rules");
    assert_eq!(down.stabilization_window_seconds, Some(900));
    let policies = down.policies.expect("policies");
    assert_eq!(
        policies
            .iter()
            .map(|p| (p.type_.as_str(), p.value, p.period_seconds))
            .collect::<Vec<_>>(),
        [("Pods", 1, 60)]
    );
}

/// `spec.proxy.zones`: the pool's pods are required in the zones (inside each of the
/// user's node selector terms) and spread over them strictly, whatever the policy; each
/// proxy pod gets its zone label in its environment and its Service keeps clients in
/// their zone. Without zones (or the proxy), nothing of it.
#[test]
fn zones_place_the_pool_and_tell_each_proxy_pod_its_zone() {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    };
    let zones = vec!["za".to_string(), "zb".to_string()];
    let user_term = |key: &str| NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.to_string(),
            operator: "Exists".to_string(),
            values: None,
        }]),
        match_fields: None,
    };
    let zoned = |policy: Option<TopologySpread>, affinity: Option<Affinity>| {
        with_spec(|s| {
            s.topology_spread = policy;
            s.affinity = affinity.map(Box::new);
            s.proxy = Some(Box::new(memcached_api::ProxySpec {
                copies: 2,
                zones: zones.clone(),
                ..memcached_api::ProxySpec::default()
            }));
        })
    };
    let terms = |d: &Deployment| -> Vec<Vec<(String, Option<Vec<String>>)>> {
        pod_spec(d)
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| {
                r.node_selector_terms
                    .iter()
                    .map(|t| {
                        t.match_expressions
                            .iter()
                            .flatten()
                            .map(|e| (e.key.clone(), e.values.clone()))
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let in_zones = (ZONE.to_string(), Some(zones.clone()));
    const ZONE: &str = "topology.kubernetes.io/zone";

    let d = deployment(&zoned(None, None));
    assert_eq!(terms(&d), [vec![in_zones.clone()]]);
    let user = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![user_term("ssd"), user_term("nvme")],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    };
    let d = deployment(&zoned(None, Some(user.clone())));
    assert_eq!(
        terms(&d),
        [
            vec![("ssd".to_string(), None), in_zones.clone()],
            vec![("nvme".to_string(), None), in_zones.clone()]
        ]
    );
    let rules = |d: &Deployment| -> Vec<(String, String)> {
        pod_spec(d)
            .topology_spread_constraints
            .iter()
            .flatten()
            .map(|c| (c.topology_key.clone(), c.when_unsatisfiable.clone()))
            .collect()
    };
    let strict = (ZONE.to_string(), "DoNotSchedule".to_string());
    for (policy, hosts) in [
        (None, Some("ScheduleAnyway")),
        (Some(TopologySpread::Required), Some("DoNotSchedule")),
        (Some(TopologySpread::Disabled), None),
    ] {
        let mut want: Vec<(String, String)> = hosts
            .map(|h| ("kubernetes.io/hostname".to_string(), h.to_string()))
            .into_iter()
            .collect();
        want.push(strict.clone());
        assert_eq!(rules(&deployment(&zoned(policy, None))), want, "{policy:?}");
    }

    let mc = zoned(None, None);
    let proxy = crate::proxy::desired_proxy_deployment(&mc, &BuildSettings::default())
        .expect("builds")
        .expect("the proxy");
    let env = pod_spec(&proxy).containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].name, crate::proxy::ZONE_ENV);
    assert_eq!(
        env[0]
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.labels['topology.kubernetes.io/zone']")
    );
    let service = crate::proxy::desired_proxy_service(&mc)
        .expect("builds")
        .expect("the proxy Service");
    assert_eq!(
        service.spec.and_then(|s| s.traffic_distribution).as_deref(),
        Some("PreferClose")
    );

    // Without zones: the user's affinity as given, no strict zone rule, no environment.
    let plain = with_spec(|s| {
        s.affinity = Some(Box::new(user.clone()));
        s.proxy = Some(Box::new(memcached_api::ProxySpec {
            copies: 2,
            ..memcached_api::ProxySpec::default()
        }));
    });
    let d = deployment(&plain);
    assert_eq!(pod_spec(&d).affinity, Some(user));
    assert!(!rules(&d).contains(&strict));
    let proxy = crate::proxy::desired_proxy_deployment(&plain, &BuildSettings::default())
        .expect("builds")
        .expect("the proxy");
    assert_eq!(pod_spec(&proxy).containers[0].env, None);
    let service = crate::proxy::desired_proxy_service(&plain)
        .expect("builds")
        .expect("the proxy Service");
    assert_eq!(service.spec.and_then(|s| s.traffic_distribution), None);
    // Zones with the proxy off: no placement (the copies are the proxy's).
    let off = with_spec(|s| {
        s.proxy = Some(Box::new(memcached_api::ProxySpec {
            enabled: false,
            copies: 2,
            zones: zones.clone(),
            ..memcached_api::ProxySpec::default()
        }));
    });
    assert_eq!(terms(&deployment(&off)), Vec::<Vec<_>>::new());
}
