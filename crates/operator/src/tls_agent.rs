//! The operator's side of the TLS reload agent, which lives in `crates/tls-agent`
//! (`memcached_tls_agent`, re-exported here): the operator's binary runs it as its
//! `tls-reload-agent` subcommand, the form pods built by this and earlier releases run.

pub use memcached_tls_agent::*;

#[cfg(test)]
mod tests {
    /// The agent's default `--admin-address` is the loopback listener the builders give
    /// memcached; the port is the Memcached API's, which reserves it.
    #[test]
    fn the_agents_default_admin_address_is_the_reserved_port() {
        assert_eq!(
            super::DEFAULT_ADMIN_ADDRESS,
            format!("127.0.0.1:{}", memcached_api::TLS_ADMIN_PORT)
        );
    }
}
