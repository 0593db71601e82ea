//! Diagnostics through [`tracing`]: weave's libraries emit events and spans and never print.
//!
//! An application sees them with any `tracing` subscriber, filtered by target — every weave
//! event's target starts with `weave::`, so `tracing_subscriber::fmt().with_env_filter("weave=info")`
//! shows them all and `weave::plan=info` only the plan choices:
//!
//! | target | what |
//! |---|---|
//! | [`INIT`] `weave::init` | communicator creation: transports to each peer, timings, GPU engine set-up |
//! | [`PLAN`] `weave::plan` | the plan each call runs (collective, bytes, algorithm, kernel), at `info` |
//! | [`KERNELS`] `weave::kernels` | kernel compiles, loads and cache hits, with their times |
//! | [`TRANSPORT`] `weave::transport` | transport set-up and what is unavailable here |
//! | [`BOOTSTRAP`] `weave::bootstrap` | refused connections, a poller that did not stop |
//! | [`FAULT`] `weave::fault` | timeouts and lost peers, with the peer and the operation |
//!
//! Every event carries the communicator's `rank` as a field where one is known. Errors are
//! returned as before; an event never replaces one.
//!
//! Binaries, the launcher's ranks and `libnccl.so.2` install one subscriber on stderr from
//! `WEAVE_DEBUG` (`install_subscriber_from_env`, a function of feature `subscriber`); a library
//! never installs one unless the application asks.

/// Communicator creation: transports to each peer, timings, the GPU engine's set-up.
pub const INIT: &str = "weave::init";
/// The plan each call runs.
pub const PLAN: &str = "weave::plan";
/// Kernel compiles, loads and cache hits.
pub const KERNELS: &str = "weave::kernels";
/// Transport set-up, and transports not available here.
pub const TRANSPORT: &str = "weave::transport";
/// The bootstrap's links: refused connections, its poller thread.
pub const BOOTSTRAP: &str = "weave::bootstrap";
/// Timeouts and lost peers.
pub const FAULT: &str = "weave::fault";

/// The `tracing` filter directives that a `WEAVE_DEBUG` value means: `off`, `warn`, `info`,
/// `debug`, `trace` (or 0–3) apply to every weave target; anything else is taken as filter
/// directives of its own (`weave::plan=info,weave::init=debug`). `None`: nothing is to be shown.
pub fn weave_debug_directives(value: &str) -> Option<String> {
    let level = match value.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "none" => return None,
        "" | "warn" | "1" => "warn",
        "info" | "2" => "info",
        "debug" => "debug",
        "trace" | "3" => "trace",
        _ => return Some(value.trim().to_string()),
    };
    Some(format!("weave={level}"))
}

/// Installs a subscriber printing weave's events on stderr, filtered by `WEAVE_DEBUG`
/// ([`weave_debug_directives`]; unset means `warn`), unless the process has one already.
/// Returns whether one was installed. What binaries and the launcher's ranks call first.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] naming `WEAVE_DEBUG` when its directives do not parse.
#[cfg(feature = "subscriber")]
pub fn install_subscriber_from_env() -> crate::Result<bool> {
    let value = std::env::var("WEAVE_DEBUG").unwrap_or_default();
    match weave_debug_directives(&value) {
        None => Ok(false),
        Some(directives) => install_subscriber(&directives).map_err(|e| {
            crate::Error::invalid(format!(
                "WEAVE_DEBUG={value:?}: {e}; expected off, warn, info, debug, trace or tracing filter directives"
            ))
        }),
    }
}

/// Installs a subscriber printing the events `directives` select (`tracing` filter syntax) on
/// stderr, unless the process has one already. Returns whether one was installed; `Err` is the
/// parse error of `directives`.
#[cfg(feature = "subscriber")]
pub fn install_subscriber(directives: &str) -> Result<bool, String> {
    let filter = tracing_subscriber::EnvFilter::builder().parse(directives).map_err(|e| e.to_string())?;
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .try_init()
        .is_ok();
    Ok(installed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weave_debug_levels_become_filters_on_every_weave_target() {
        assert_eq!(weave_debug_directives("INFO").as_deref(), Some("weave=info"));
        assert_eq!(weave_debug_directives("2").as_deref(), Some("weave=info"));
        assert_eq!(weave_debug_directives("").as_deref(), Some("weave=warn"), "unset means warn");
        assert_eq!(weave_debug_directives("trace").as_deref(), Some("weave=trace"));
        assert_eq!(weave_debug_directives("off"), None);
        assert_eq!(weave_debug_directives("weave::plan=info").as_deref(), Some("weave::plan=info"));
    }
}
