//! Logging set-up: a global `tracing` subscriber with a RUST_LOG-style filter and a
//! JSON (default for clusters) or human-readable text format.

use tracing_subscriber::EnvFilter;

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    #[default]
    Json,
    /// Human-readable text.
    Text,
}

/// Builds the filter: `RUST_LOG` if set and valid, else `default_filter`
/// (e.g. `"info"` or `"info,kube=warn"`), else `info`.
pub fn filter(default_filter: &str) -> EnvFilter {
    EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(default_filter))
        .unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Installs the global subscriber. Calling it a second time does nothing
/// (the first subscriber stays), so tests and binaries can both call it.
pub fn init(format: LogFormat, default_filter: &str) {
    let builder = tracing_subscriber::fmt().with_env_filter(filter(default_filter));
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if let Err(err) = result {
        tracing::debug!(%err, "global subscriber already installed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_twice_is_harmless() {
        init(LogFormat::Text, "debug");
        init(LogFormat::Json, "info");
        tracing::info!("logging works");
    }

    #[test]
    fn invalid_default_filter_falls_back() {
        let f = filter("this is [not a filter");
        assert!(!f.to_string().is_empty());
    }

    #[test]
    fn value_enum_parses() {
        use clap::ValueEnum;
        assert_eq!(LogFormat::from_str("json", true), Ok(LogFormat::Json));
        assert_eq!(LogFormat::from_str("text", true), Ok(LogFormat::Text));
    }
}
