//! Prints the metrics text for one controller (a quick look at the exposition).
fn main() {
    let metrics = manager::Metrics::new();
    let c = metrics.controller("memcached");
    drop(c.reconcile_started());
    c.record_result(manager::ReconcileResult::Success);
    metrics.set_leader("memcached-operator-lock", true);
    print!("{}", metrics.encode());
}
