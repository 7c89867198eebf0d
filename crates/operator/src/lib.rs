//! Memcached operator.
