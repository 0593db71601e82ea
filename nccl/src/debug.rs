//! `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` mapped onto weave's diagnostics: the first exported call
//! installs one `tracing` subscriber on stderr ([`comm_core::diagnostics`]) when either variable,
//! or `WEAVE_DEBUG`, asks for output, and never when the process has a subscriber already.
//!
//! | `NCCL_DEBUG` | shows |
//! |---|---|
//! | unset, `VERSION`, `NONE` | nothing (unless `WEAVE_DEBUG` is set: then its filter) |
//! | `WARN` | every failure and warning |
//! | `INFO` | also communicator creation, splits, plan choices, kernels, transports |
//! | `TRACE` | everything |
//!
//! `NCCL_DEBUG_SUBSYS` narrows `INFO` and `TRACE` to subsystems (warnings always show): `INIT` →
//! `weave::init` and this library's own events, `COLL` and `P2P` → `weave::plan`, `NET` →
//! `weave::transport` and `weave::bootstrap`, `TUNING` → `weave::plan`, `ALL` → everything;
//! others name nothing weave has and are ignored. `^` (NCCL's "all but") is taken as `ALL`.

use std::sync::Once;

use comm_core::diagnostics;

/// The target of this library's own events (init, split, refused calls, failed calls).
pub const NCCL: &str = "weave::nccl";

/// The filter directives `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` mean; `None`: show nothing.
pub fn nccl_debug_directives(debug: Option<&str>, subsystems: Option<&str>) -> Option<String> {
    let level = match debug.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("WARN") => "warn",
        Some("INFO") | Some("ABORT") => "info",
        Some("TRACE") => "trace",
        _ => return None,
    };
    let subsystems = subsystems.map(str::trim).filter(|s| !s.is_empty() && !s.starts_with('^'));
    let Some(subsystems) = subsystems.filter(|_| level != "warn") else {
        return Some(format!("weave={level}"));
    };
    let mut targets: Vec<&str> = Vec::new();
    for name in subsystems.split(',').map(|s| s.trim().to_ascii_uppercase()) {
        let named: &[&str] = match name.as_str() {
            "ALL" => return Some(format!("weave={level}")),
            "INIT" => &[diagnostics::INIT, NCCL],
            "COLL" | "P2P" | "TUNING" => &[diagnostics::PLAN],
            "NET" => &[diagnostics::TRANSPORT, diagnostics::BOOTSTRAP],
            _ => &[],
        };
        for t in named {
            if !targets.contains(t) {
                targets.push(t);
            }
        }
    }
    let mut directives = String::from("weave=warn");
    for t in targets {
        directives.push_str(&format!(",{t}={level}"));
    }
    Some(directives)
}

/// Installs the subscriber `NCCL_DEBUG` / `WEAVE_DEBUG` ask for, once per process.
pub fn install_subscriber_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let nccl = nccl_debug_directives(
            std::env::var("NCCL_DEBUG").ok().as_deref(),
            std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
        );
        let directives = match (nccl, std::env::var("WEAVE_DEBUG")) {
            (Some(d), _) => Some(d),
            (None, Ok(weave)) => diagnostics::weave_debug_directives(&weave),
            (None, Err(_)) => None,
        };
        if let Some(d) = directives
            && let Err(e) = diagnostics::install_subscriber(&d)
        {
            // No subscriber, so the one place left to say it is stderr.
            eprintln!("weave-nccl: NCCL_DEBUG / WEAVE_DEBUG filter {d:?} does not parse: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_debug_levels_and_subsystems_become_weave_filters() {
        assert_eq!(nccl_debug_directives(None, None), None);
        assert_eq!(nccl_debug_directives(Some("VERSION"), None), None);
        assert_eq!(nccl_debug_directives(Some("warn"), Some("INIT")).as_deref(), Some("weave=warn"));
        assert_eq!(nccl_debug_directives(Some("INFO"), None).as_deref(), Some("weave=info"));
        assert_eq!(nccl_debug_directives(Some("INFO"), Some("ALL")).as_deref(), Some("weave=info"));
        assert_eq!(nccl_debug_directives(Some("INFO"), Some("^INIT")).as_deref(), Some("weave=info"));
        assert_eq!(
            nccl_debug_directives(Some("INFO"), Some("INIT,COLL,P2P,GRAPH")).as_deref(),
            Some("weave=warn,weave::init=info,weave::nccl=info,weave::plan=info")
        );
        assert_eq!(
            nccl_debug_directives(Some("TRACE"), Some("NET")).as_deref(),
            Some("weave=warn,weave::transport=trace,weave::bootstrap=trace")
        );
    }
}
