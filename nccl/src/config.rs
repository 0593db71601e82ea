//! `ncclConfig_t` as weave reads it: `blocking`, `commName` and `splitShare` for every
//! communicator (`NCCL_COMM_SPLIT_SHARE_RESOURCES` overrides the last, as in NCCL), `maxCTAs`
//! for a new one (it caps the grid of weave's block-pipelined kernels), and every other field
//! the program set named at `NCCL_DEBUG=INFO` as ignored, with why; and weave's own settings of
//! a libnccl communicator (`communicator_config`: how long a wait for a live peer may last).

use std::ffi::{c_char, c_int};
use std::time::Duration;

use comm_core::config::Config;

use crate::abi::{self, CONFIG_UNDEF_INT, NcclConfig};
use crate::error::Fail;

/// The `ncclConfig_t` fields past `blocking` and `commName`: the one weave honours and the
/// ones it ignores.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ConfigTuning {
    /// `maxCTAs`: the most thread blocks one of weave's kernels runs with (it caps the
    /// block-pipelined kernels' grid, `GpuConfig::pipeline_blocks`).
    pub(crate) max_ctas: Option<u32>,
    /// `splitShare`, where the program set it: whether the communicator's splits that keep
    /// every rank share its weave communicator (`handle.rs`, families).
    pub(crate) split_share: Option<bool>,
    /// Each field the program set that weave ignores, with why (logged at `NCCL_DEBUG=INFO`).
    pub(crate) ignored: Vec<String>,
}

impl ConfigTuning {
    /// Logs the ignored fields at `NCCL_DEBUG=INFO` (with the rank, where known).
    pub(crate) fn log_ignored(&self, rank: Option<usize>) {
        for field in &self.ignored {
            tracing::info!(target: crate::debug::NCCL, rank = ?rank, "ncclConfig_t.{field}");
        }
    }

    /// `splitShare` as NCCL settles it ([`split_share`]: the variable over the config); `None`
    /// where neither says.
    pub(crate) fn settled_split_share(&self) -> Result<Option<bool>, Fail> {
        split_share(self.split_share, env_split_share().as_deref())
    }

    /// Whether a new communicator's splits share it: [`settled_split_share`](Self::settled_split_share),
    /// off where nothing says.
    pub(crate) fn split_share_of_new(&self) -> Result<bool, Fail> {
        Ok(self.settled_split_share()?.unwrap_or(false))
    }
}

/// What a communicator derived from another (split, shrink, grow) takes of its `ncclConfig_t`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DerivedConfig {
    /// Whether its calls block.
    pub(crate) blocking: bool,
    /// Its `commName`, or empty.
    pub(crate) name: String,
    /// Whether its own splits share it (`splitShare`, or the parent's when unset).
    pub(crate) split_share: bool,
}

/// Reads the fields of `config` a derived communicator (split, shrink, grow) uses: blocking,
/// name and `splitShare`, each the parent's (`inherit`) where NULL or unset. It keeps its
/// parent's GPU settings: every other field the program set is logged as ignored.
///
/// # Safety
/// `config` is NULL or points at an `ncclConfig_t` of at least its `size` bytes.
pub(crate) unsafe fn read_config(config: *const NcclConfig, inherit: &DerivedConfig) -> Result<DerivedConfig, Fail> {
    // SAFETY: forwarded from the caller.
    let (blocking, name, mut tuning) = unsafe { read_config_fields(config, inherit.blocking) }?;
    if let Some(most) = tuning.max_ctas.take() {
        tuning
            .ignored
            .push(format!("maxCTAs = {most} ignored: a derived communicator keeps its parent's GPU settings"));
    }
    tuning.log_ignored(None);
    let split_share = tuning.settled_split_share()?.unwrap_or(inherit.split_share);
    Ok(DerivedConfig { blocking, name, split_share })
}

/// How long a libnccl communicator waits for a peer that is alive but has not come yet, where
/// `WEAVE_TIMEOUT` is unset: 30 minutes, three times PyTorch's default watchdog (10 minutes).
///
/// NCCL waits for such a peer for ever and leaves the verdict to the program (PyTorch's watchdog
/// aborts the communicator at its `timeout`). weave's own default, one minute, would fail a job
/// whose rank spends two minutes saving a checkpoint while the others wait in an all-reduce. A
/// dead peer is found in milliseconds whatever this bound is, and `ncclCommAbort` ends every
/// wait at once; the bound only turns a wait that nothing else ends into an error.
pub const UNSET_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// weave's settings for a libnccl communicator: the `WEAVE_*` variables read through `get` (see
/// [`Config::from_vars`]), with waits bounded by [`UNSET_TIMEOUT`] where `WEAVE_TIMEOUT` is unset
/// or empty.
pub(crate) fn communicator_config(get: impl Fn(&str) -> Option<String>) -> Result<Config, Fail> {
    let timeout_unset = get("WEAVE_TIMEOUT").is_none_or(|v| v.trim().is_empty());
    let mut config = Config::from_vars(get)?;
    if timeout_unset {
        config.timeout = UNSET_TIMEOUT;
    }
    Ok(config)
}

/// `NCCL_COMM_SPLIT_SHARE_RESOURCES`, where set.
pub(crate) fn env_split_share() -> Option<String> {
    std::env::var("NCCL_COMM_SPLIT_SHARE_RESOURCES").ok()
}

/// `splitShare` as NCCL settles it: `NCCL_COMM_SPLIT_SHARE_RESOURCES` (`env`, 0 or 1) over the
/// config's value; `None` where neither says.
pub(crate) fn split_share(config: Option<bool>, env: Option<&str>) -> Result<Option<bool>, Fail> {
    match env.map(str::trim) {
        None | Some("") => Ok(config),
        Some("0") => Ok(Some(false)),
        Some("1") => Ok(Some(true)),
        Some(other) => Err(Fail::invalid(format!("NCCL_COMM_SPLIT_SHARE_RESOURCES is {other:?}; it must be 0 or 1"))),
    }
}

/// Every field of `config`: blocking, name, and the rest as [`ConfigTuning`]. NULL means
/// defaults.
///
/// # Safety
/// `config` is NULL or points at an `ncclConfig_t` of at least its `size` bytes.
pub(crate) unsafe fn read_config_fields(
    config: *const NcclConfig,
    inherit_blocking: bool,
) -> Result<(bool, String, ConfigTuning), Fail> {
    use std::mem::{offset_of, size_of};
    if config.is_null() {
        return Ok((inherit_blocking, String::new(), ConfigTuning::default()));
    }
    // SAFETY: the first 16 bytes (size, magic, version) exist in every ncclConfig_t.
    let (size, magic) = unsafe { ((*config).size, (*config).magic) };
    if magic != abi::API_MAGIC {
        return Err(Fail::invalid(format!(
            "config has magic {magic:#x}, not {:#x}: initialize it with NCCL_CONFIG_INITIALIZER",
            abi::API_MAGIC
        )));
    }
    // A field is read only when the program's struct (its `size` bytes) holds it; an unset
    // integer (NCCL_CONFIG_UNDEF_INT) reads as None.
    let int = |offset: usize| -> Option<c_int> {
        if size < offset + size_of::<c_int>() {
            return None;
        }
        // SAFETY: the caller's struct holds `size` bytes, and this field lies inside them.
        let v = unsafe { config.cast::<u8>().add(offset).cast::<c_int>().read_unaligned() };
        (v != CONFIG_UNDEF_INT).then_some(v)
    };
    let pointer = |offset: usize| -> *const c_char {
        if size < offset + size_of::<*const c_char>() {
            return std::ptr::null();
        }
        // SAFETY: as for `int`.
        unsafe { config.cast::<u8>().add(offset).cast::<*const c_char>().read_unaligned() }
    };
    let text = |p: *const c_char| {
        // SAFETY: a non-null string field is a NUL-terminated string the program owns.
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let name = text(pointer(offset_of!(NcclConfig, commName))).unwrap_or_default();
    let blocking = match int(offset_of!(NcclConfig, blocking)) {
        None => inherit_blocking,
        Some(0) => false,
        Some(1) => true,
        Some(other) => return Err(Fail::invalid(format!("config.blocking is {other}; it must be 0 or 1"))),
    };
    let mut tuning = ConfigTuning::default();
    if let Some(most) = int(offset_of!(NcclConfig, maxCTAs)) {
        let most = u32::try_from(most)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| Fail::invalid(format!("config.maxCTAs is {most}; it must be at least 1")))?;
        tuning.max_ctas = Some(most);
    }
    tuning.split_share = match int(offset_of!(NcclConfig, splitShare)) {
        None => None,
        Some(0) => Some(false),
        Some(1) => Some(true),
        Some(other) => return Err(Fail::invalid(format!("config.splitShare is {other}; it must be 0 or 1"))),
    };
    let ignored_ints: [(&str, usize, &str); 9] = [
        ("cgaClusterSize", offset_of!(NcclConfig, cgaClusterSize), "weave's kernels launch no thread block clusters"),
        ("minCTAs", offset_of!(NcclConfig, minCTAs), "weave sizes each kernel's grid by the call (maxCTAs caps it)"),
        ("trafficClass", offset_of!(NcclConfig, trafficClass), "weave sets no traffic class on its connections"),
        ("collnetEnable", offset_of!(NcclConfig, collnetEnable), "weave has no CollNet"),
        ("CTAPolicy", offset_of!(NcclConfig, CTAPolicy), "weave's plan picks the grid"),
        ("shrinkShare", offset_of!(NcclConfig, shrinkShare), "a shrink reuses what it can by itself"),
        ("nvlsCTAs", offset_of!(NcclConfig, nvlsCTAs), "weave never uses NVLink SHARP"),
        ("nChannelsPerNetPeer", offset_of!(NcclConfig, nChannelsPerNetPeer), "weave's plan picks its channels"),
        ("nvlinkCentricSched", offset_of!(NcclConfig, nvlinkCentricSched), "weave's plan picks the schedule"),
    ];
    for (field, offset, why) in ignored_ints {
        if let Some(v) = int(offset) {
            tuning.ignored.push(format!("{field} = {v} ignored: {why}"));
        }
    }
    if let Some(net) = text(pointer(offset_of!(NcclConfig, netName))) {
        tuning.ignored.push(format!("netName = {net:?} ignored: weave picks its transports itself (WEAVE_TRANSPORTS)"));
    }
    Ok((blocking, name, tuning))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::NcclResult;
    use crate::error::Fail;

    /// A config as NCCL_CONFIG_INITIALIZER leaves it: every field unset.
    fn initialized() -> NcclConfig {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: abi::API_MAGIC,
            version: 22800,
            blocking: CONFIG_UNDEF_INT,
            cgaClusterSize: CONFIG_UNDEF_INT,
            minCTAs: CONFIG_UNDEF_INT,
            maxCTAs: CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: CONFIG_UNDEF_INT,
            trafficClass: CONFIG_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: CONFIG_UNDEF_INT,
            CTAPolicy: CONFIG_UNDEF_INT,
            shrinkShare: CONFIG_UNDEF_INT,
            nvlsCTAs: CONFIG_UNDEF_INT,
            nChannelsPerNetPeer: CONFIG_UNDEF_INT,
            nvlinkCentricSched: CONFIG_UNDEF_INT,
        }
    }

    fn read(c: &NcclConfig) -> Result<(bool, String, ConfigTuning), Fail> {
        // SAFETY: a whole, initialized config.
        unsafe { read_config_fields(c, true) }
    }

    #[test]
    fn max_ctas_is_kept_and_every_other_set_field_is_named_as_ignored() {
        let (blocking, name, tuning) = read(&initialized()).unwrap();
        assert_eq!((blocking, name.as_str(), tuning), (true, "", ConfigTuning::default()));
        let c = NcclConfig {
            blocking: 0,
            maxCTAs: 8,
            cgaClusterSize: 2,
            splitShare: 1,
            netName: c"IB".as_ptr(),
            commName: c"tp".as_ptr(),
            ..initialized()
        };
        let (blocking, name, tuning) = read(&c).unwrap();
        assert_eq!((blocking, name.as_str(), tuning.max_ctas, tuning.split_share), (false, "tp", Some(8), Some(true)));
        let ignored = tuning.ignored.join("; ");
        for field in ["cgaClusterSize = 2", "netName = \"IB\""] {
            assert!(ignored.contains(field), "{field} missing from {ignored}");
        }
        assert_eq!(tuning.ignored.len(), 2, "{ignored}");
    }

    #[test]
    fn split_share_comes_from_the_variable_over_the_config_then_the_parent() {
        assert_eq!(split_share(None, None).unwrap(), None);
        assert_eq!(split_share(Some(true), None).unwrap(), Some(true));
        assert_eq!(split_share(Some(true), Some("0")).unwrap(), Some(false));
        assert_eq!(split_share(None, Some(" 1")).unwrap(), Some(true));
        assert_eq!(split_share(Some(false), Some("")).unwrap(), Some(false));
        assert_eq!(split_share(None, Some("yes")).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
        let bad = NcclConfig { splitShare: 2, ..initialized() };
        assert_eq!(read(&bad).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
        // A derived communicator: the parent's where its own config leaves it unset.
        let parent = DerivedConfig { blocking: true, name: String::new(), split_share: true };
        if env_split_share().is_none() {
            // SAFETY: NULL is a valid config argument (defaults).
            let child = unsafe { read_config(std::ptr::null(), &parent) }.unwrap();
            assert!(child.split_share && child.blocking);
            let off = NcclConfig { splitShare: 0, ..initialized() };
            // SAFETY: a whole, initialized config.
            assert!(!unsafe { read_config(&off, &parent) }.unwrap().split_share);
        }
    }

    #[test]
    fn fields_past_an_older_programs_size_are_unset_and_bad_values_are_refused() {
        // A program built against a header whose struct ends before maxCTAs.
        let old = NcclConfig { size: std::mem::offset_of!(NcclConfig, maxCTAs), maxCTAs: 8, ..initialized() };
        assert_eq!(read(&old).unwrap().2.max_ctas, None);
        for bad in [NcclConfig { maxCTAs: 0, ..initialized() }, NcclConfig { blocking: 2, ..initialized() }] {
            assert_eq!(read(&bad).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
        }
        assert_eq!(read(&NcclConfig { magic: 1, ..initialized() }).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
    }

    #[test]
    fn waits_for_a_live_peer_last_thirty_minutes_unless_weave_timeout_says() {
        let vars = |timeout: Option<&'static str>| {
            move |name: &str| if name == "WEAVE_TIMEOUT" { timeout.map(String::from) } else { None }
        };
        assert_eq!(communicator_config(vars(None)).unwrap().timeout, UNSET_TIMEOUT);
        assert_eq!(communicator_config(vars(Some(" "))).unwrap().timeout, UNSET_TIMEOUT);
        assert_eq!(communicator_config(vars(Some("20s"))).unwrap().timeout, Duration::from_secs(20));
        assert_eq!(communicator_config(vars(Some("forever"))).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
        assert!(UNSET_TIMEOUT > comm_core::config::DEFAULT_TIMEOUT);
    }
}
