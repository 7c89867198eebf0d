//! kubectl over HTTP: the pinned kubectl (`make controlplane` builds it).
//! kubectl needs `--validate=false` for create/apply: apisim serves no OpenAPI.

use std::process::Command;

fn kubectl(kubeconfig: &str, args: &[&str], stdin_file: Option<&str>) -> (bool, String) {
    let mut c = Command::new(envtest::kubectl_path().unwrap_or_else(|e| panic!("{e}")));
    c.arg("--kubeconfig").arg(kubeconfig).args(args);
    if let Some(f) = stdin_file {
        c.arg("-f").arg(f);
    }
    let o = c.output().expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_get_apply_delete() {
    let server = apisim::ApiServer::new();
    let h = server.serve().await.unwrap();
    let dir = std::env::temp_dir().join(format!("apisim-kubectl-{}", h.port()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    h.write_kubeconfig(&kc).unwrap();
    let kc = kc.to_str().unwrap().to_string();
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cm = write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kc\ndata:\n  a: \"1\"\n",
    );
    let cm2 = write(
        "cm2.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kc\ndata:\n  a: \"2\"\n",
    );
    let crd = write(
        "crd.yaml",
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: memcacheds.cache.example.com}
spec:
  group: cache.example.com
  names: {kind: Memcached, plural: memcacheds, singular: memcached, shortNames: [mc]}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.replicas}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, minimum: 0}
"#,
    );
    let cr = write(
        "cr.yaml",
        "apiVersion: cache.example.com/v1\nkind: Memcached\nmetadata: {name: m1}\nspec: {size: 2}\n",
    );
    let bad_cr = write(
        "bad.yaml",
        "apiVersion: cache.example.com/v1\nkind: Memcached\nmetadata: {name: m2}\nspec: {size: -1}\n",
    );
    let kc2 = kc.clone();
    let run = move |args: Vec<String>, f: Option<String>| {
        let kc = kc2.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                kubectl(&kc, &a, f.as_deref())
            })
            .await
            .unwrap()
        }
    };
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let (ok, out) = run(v(&["create", "--validate=false"]), Some(cm.clone())).await;
    assert!(ok, "{out}");
    let (ok, out) = run(
        v(&["get", "configmap", "kc", "-o", "jsonpath={.data.a}"]),
        None,
    )
    .await;
    assert!(ok && out.trim() == "1", "{out}");
    let (ok, out) = run(v(&["get", "cm"]), None).await;
    assert!(ok && out.contains("kc"), "{out}");
    // SSA by kubectl conflicts with the creating manager; --force-conflicts resolves it
    let (ok, out) = run(
        v(&["apply", "--server-side", "--validate=false"]),
        Some(cm2.clone()),
    )
    .await;
    assert!(!ok && out.contains("conflict"), "{out}");
    let (ok, out) = run(
        v(&[
            "apply",
            "--server-side",
            "--validate=false",
            "--force-conflicts",
        ]),
        Some(cm2.clone()),
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(
        server
            .get_object("v1", "configmaps", Some("default"), "kc")
            .unwrap()["data"]["a"],
        "2"
    );
    let (ok, out) = run(v(&["delete", "configmap", "kc"]), None).await;
    assert!(ok, "{out}");
    assert!(
        server
            .get_object("v1", "configmaps", Some("default"), "kc")
            .is_none()
    );

    // a CRD and a custom resource
    let (ok, out) = run(v(&["create", "--validate=false"]), Some(crd.clone())).await;
    assert!(ok, "{out}");
    let (ok, out) = run(
        v(&["apply", "--server-side", "--validate=false"]),
        Some(cr.clone()),
    )
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["get", "mc"]), None).await;
    assert!(ok && out.contains("m1"), "{out}");
    let (ok, out) = run(v(&["scale", "memcached", "m1", "--replicas=4"]), None).await;
    assert!(ok, "{out}");
    let (ok, out) = run(
        v(&["get", "memcached", "m1", "-o", "jsonpath={.spec.size}"]),
        None,
    )
    .await;
    assert!(ok && out.trim() == "4", "{out}");
    let (ok, out) = run(v(&["create", "--validate=false"]), Some(bad_cr.clone())).await;
    assert!(!ok && out.contains("spec.size"), "{out}");
    let (ok, out) = run(v(&["delete", "memcached", "m1"]), None).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["delete"]), Some(crd.clone())).await;
    assert!(ok, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
