//! Serve an apisim instance over HTTP until Ctrl-C.
//!
//! `cargo run -p apisim --example serve -- [--simulator] [--kubeconfig PATH]`
//! then e.g. `kubectl --server http://127.0.0.1:PORT get ns`.

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sim = args.iter().any(|a| a == "--simulator");
    let server = apisim::ApiServer::builder().workload_simulator(sim).build();
    let handle = server.serve().await?;
    println!("{}", handle.url());
    if let Some(i) = args.iter().position(|a| a == "--kubeconfig")
        && let Some(p) = args.get(i + 1)
    {
        handle.write_kubeconfig(p)?;
        println!("kubeconfig written to {p}");
    }
    tokio::signal::ctrl_c().await?;
    println!("{}", server.request_counts());
    Ok(())
}
