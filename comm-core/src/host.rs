//! Host identity: which ranks share a machine (a *node*).
//!
//! Two ranks are on the same node when their identities are equal. The identity is
//! `hostname/boot-id` (the boot id tells apart machines that share a hostname, and one machine
//! before and after a reboot), or `WEAVE_HOST_ID` where it is set — as `NCCL_HOSTID` does, it
//! lets one machine pose as several nodes for tests, or merges containers that see one host.
//! Transports that only work inside one machine (shared memory, CUDA IPC) compare it too, so a
//! posed node boundary is a real one: only network transports cross it.

/// Longest hostname kept in an identity (characters).
const MAX_HOSTNAME_CHARS: usize = 255;
/// Longest boot id kept in an identity (characters).
const MAX_BOOT_ID_CHARS: usize = 64;
/// Longest identity accepted from `WEAVE_HOST_ID` or a peer (bytes).
pub const MAX_HOST_ID_LEN: usize = 512;

/// This process's host identity: `over` (from [`Config::host_id`](crate::config::Config::host_id))
/// where given, else `hostname/boot-id`.
pub fn host_identity(over: Option<&str>) -> String {
    if let Some(id) = over {
        return id.to_string();
    }
    let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let hostname =
        read("/proc/sys/kernel/hostname").or_else(|| read("/etc/hostname")).unwrap_or_else(|| "unknown-host".into());
    let hostname: String = hostname.chars().take(MAX_HOSTNAME_CHARS).collect();
    let boot_id: String =
        read("/proc/sys/kernel/random/boot_id").unwrap_or_default().chars().take(MAX_BOOT_ID_CHARS).collect();
    format!("{hostname}/{boot_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_wins_and_the_default_is_stable() {
        assert_eq!(host_identity(Some("node-a")), "node-a");
        let a = host_identity(None);
        assert_eq!(a, host_identity(None));
        assert!(a.contains('/') && a.len() <= MAX_HOST_ID_LEN, "{a}");
    }
}
