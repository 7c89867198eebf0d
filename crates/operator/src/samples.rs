//! Sample Memcached objects: the seed's sample, which `config/samples` and the OLM bundle
//! ship, the demo applies and the tests start from.

/// The seed's sample, verbatim (config/samples in the seed's project).
pub const SEED_SAMPLE: &str = "\
apiVersion: memcached.cache.example.com/v1
kind: Memcached
metadata:
  name: memcached-sample
spec:
  size: 3
";
