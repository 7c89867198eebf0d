//! The `memcached-tls-agent` binary: the TLS reload agent on its own, for an image of its
//! own. The same agent runs as `memcached-operator tls-reload-agent`.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "memcached-tls-agent",
    version,
    about = "The TLS reload agent (a sidecar in memcached pods): has memcached load a renewed certificate in place when the mounted files change"
)]
struct Cli {
    #[command(flatten)]
    args: memcached_tls_agent::AgentArgs,
}

fn main() -> ExitCode {
    memcached_tls_agent::run(Cli::parse().args)
}
