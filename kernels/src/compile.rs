//! Run-time compilation with NVRTC, and the on-disk cache of its results.
//!
//! [`compile`] (or a configured [`Compiler`]) turns a CUDA C++ source — usually one made by
//! [`crate::source::program`] — into PTX, plus a CUBIN when the target is a concrete `sm_XX`.
//! Every program gets the embedded weave headers as named headers ([`crate::source::HEADERS`]).
//!
//! NVRTC is loaded at run time ([`crate::nvrtc`]): `WEAVE_NVRTC` (a library name or path) when
//! set, else the newest of `libnvrtc.so.13`, `libnvrtc.so.12` and `libnvrtc.so` (found through
//! `LD_LIBRARY_PATH` or the loader cache) that is no newer than the CUDA driver, whose own major
//! version comes first: a CUDA 12 driver gets NVRTC 12, whose code it can run (NVRTC opens its
//! `libnvrtc-builtins` by name, so a path in `WEAVE_NVRTC` needs its directory on
//! `LD_LIBRARY_PATH` too). Without one,
//! compiling returns [`Error::Unsupported`] saying how to install it. Compile errors come back as
//! [`Error::Cuda`] with operation `"nvrtc compile"` and NVRTC's log as the message.
//!
//! # Cache
//!
//! Results are kept on disk (`disk_cache.rs`), keyed by a 128-bit FNV-1a hash of the source, the headers, the
//! architecture, the options and the NVRTC version, in one file per key. The directory is
//! chosen by [`cache_dir_from_env`] (`WEAVE_KERNEL_CACHE`). Entries are written to a temporary
//! file and renamed into place, so readers never see half an entry; an entry that fails its
//! checks (magic, version, key, lengths, checksum, PTX text) is ignored and rebuilt. Only a
//! directory and entries that are this user's alone are trusted (what is loaded runs on the
//! GPU); links, pipes and oversized files are misses. A cache that cannot be written never
//! fails a compile: [`CompiledKernel::cache`] says what happened.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use comm_core::{Error, Result};

pub use crate::disk_cache::entry_path;
use crate::disk_cache::{encode_entry, read_entry, store_entry};
use crate::nvrtc::{Nvrtc, NvrtcError, SPLIT_COMPILE, base_options, library_candidates, takes_split_compile};
use crate::program_text::{Fnv128, HEADERS};

/// What the on-disk cache did for one compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The result was read from the cache; NVRTC did not run.
    Hit,
    /// NVRTC ran and the result was stored.
    Stored,
    /// NVRTC ran; storing the result failed (the reason). The result is still good.
    NotStored(String),
    /// No cache directory is configured.
    Disabled,
}

/// The output of one compile: PTX, and a CUBIN for concrete `sm_XX` targets.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    arch: String,
    ptx: String,
    cubin: Option<Vec<u8>>,
    key: u128,
    log: String,
    cache: CacheOutcome,
}

impl CompiledKernel {
    /// The target architecture it was compiled for (`sm_90`, `compute_90`, …).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The PTX text.
    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// The CUBIN (machine code for [`arch`](Self::arch)), when the target was a concrete `sm_XX`.
    pub fn cubin(&self) -> Option<&[u8]> {
        self.cubin.as_deref()
    }

    /// The cache key: a hash of everything that determined this result. Modules loaded from the
    /// same key are shared ([`crate::module::KernelModule::load`]).
    pub fn key(&self) -> u128 {
        self.key
    }

    /// NVRTC's log (warnings); empty for a cache hit.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// What the cache did.
    pub fn cache(&self) -> &CacheOutcome {
        &self.cache
    }
}

/// Where the kernel cache lives, from the environment. The kernels crate reads the environment
/// only in this module (here, and `WEAVE_NVRTC` for the library to load):
///
/// - `WEAVE_KERNEL_CACHE=<dir>`: that directory; `off`, `0`, `none` or empty disables the cache;
/// - otherwise `$XDG_CACHE_HOME/weave/kernels`, else `$HOME/.cache/weave/kernels`;
/// - `None` (no cache) when none of these is set.
pub fn cache_dir_from_env() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("WEAVE_KERNEL_CACHE") {
        let off = v.is_empty() || ["off", "0", "none"].iter().any(|o| v.eq_ignore_ascii_case(o));
        return if off { None } else { Some(PathBuf::from(v)) };
    }
    let nonempty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(xdg) = nonempty("XDG_CACHE_HOME") {
        return Some(xdg.join("weave").join("kernels"));
    }
    nonempty("HOME").map(|home| home.join(".cache").join("weave").join("kernels"))
}

/// The CUDA major version of the installed driver, when there is one.
pub fn driver_major() -> Option<i32> {
    // SAFETY: only tries to dlopen the driver library; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    let mut version = 0;
    // SAFETY: cuDriverGetVersion needs no cuInit; the pointer is valid for writes.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (r == cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS && version > 0).then_some(version / 1000)
}

/// The NVRTC this process compiles with, loaded at the first use (see the module docs), or why
/// there is none.
fn loaded_nvrtc() -> &'static std::result::Result<Nvrtc, String> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC.get_or_init(|| {
        let driver = driver_major();
        let candidates = match std::env::var("WEAVE_NVRTC") {
            Ok(v) if !v.is_empty() => vec![v],
            _ => library_candidates(driver),
        };
        Nvrtc::open(&candidates, driver)
    })
}

/// True when an NVRTC that the driver can run the code of can be loaded.
pub fn nvrtc_available() -> bool {
    loaded_nvrtc().is_ok()
}

/// The NVRTC in use, or [`Error::Unsupported`] saying what was tried and how to install one.
fn nvrtc() -> Result<&'static Nvrtc> {
    loaded_nvrtc().as_ref().map_err(|tried| {
        Error::Unsupported(format!(
            "no usable NVRTC ({tried}); install the one of the driver's CUDA version (`python3 -m pip \
             install nvidia-cuda-nvrtc==13.0.88` for CUDA 13, `nvidia-cuda-nvrtc-cu12` for CUDA 12, or \
             the CUDA toolkit) and put its lib directory (e.g. site-packages/nvidia/cu13/lib, or \
             /usr/local/cuda/lib64) on LD_LIBRARY_PATH, or name the library in WEAVE_NVRTC"
        ))
    })
}

/// The NVRTC version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    Ok(nvrtc()?.version())
}

/// Where the NVRTC in use was loaded from (a library name or path).
pub fn nvrtc_library() -> Result<&'static str> {
    Ok(nvrtc()?.name())
}

/// Checks an architecture name: `sm_<digits>[a|f]` or `compute_<digits>[a|f]`. True for `sm_`.
fn check_arch(arch: &str) -> Result<bool> {
    let (concrete, rest) = match (arch.strip_prefix("sm_"), arch.strip_prefix("compute_")) {
        (Some(r), _) => (true, r),
        (_, Some(r)) => (false, r),
        _ => return Err(Error::invalid(format!("GPU architecture {arch:?} must look like sm_90 or compute_90"))),
    };
    let digits = rest.trim_end_matches(['a', 'f']);
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) || rest.len() > digits.len() + 1 {
        return Err(Error::invalid(format!("GPU architecture {arch:?} must look like sm_90 or compute_90")));
    }
    Ok(concrete)
}

// ---- the compiler ---------------------------------------------------------------------------

/// An NVRTC configuration: cache directory, include paths and extra options.
#[derive(Debug, Clone, Default)]
pub struct Compiler {
    cache_dir: Option<PathBuf>,
    include_paths: Vec<PathBuf>,
    extra_options: Vec<String>,
}

impl Compiler {
    /// Cache from [`cache_dir_from_env`], no include paths, no extra options.
    pub fn from_env() -> Self {
        Compiler { cache_dir: cache_dir_from_env(), ..Compiler::default() }
    }

    /// No cache: every compile runs NVRTC.
    pub fn without_cache() -> Self {
        Compiler::default()
    }

    /// Caches in `dir` (created when needed).
    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Self {
        Compiler { cache_dir: Some(dir.into()), ..Compiler::default() }
    }

    /// Adds an include directory (`--include-path`), e.g. `/usr/local/cuda/include` and
    /// `/usr/local/cuda/include/cccl` for sources that include toolkit headers. weave's own
    /// headers need none.
    pub fn include_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include_paths.push(dir.into());
        self
    }

    /// Adds an NVRTC option after the defaults (e.g. `-DNAME=1`, `--maxrregcount=64`).
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.extra_options.push(option.into());
        self
    }

    /// The cache directory, if any.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// The NVRTC options used for `arch`: `-std=c++17`, `--gpu-architecture=<arch>`,
    /// `-default-device`, `--dopt=on`, `-lineinfo`, then include paths and extra options.
    /// [`compile`](Self::compile) also passes `--split-compile=0` (optimize on every core) to
    /// NVRTC 12.1 and later, unless an extra option sets `--split-compile` itself.
    pub fn options(&self, arch: &str) -> Vec<String> {
        let mut o = base_options(arch);
        o.extend(self.include_paths.iter().map(|p| format!("--include-path={}", p.display())));
        o.extend(self.extra_options.iter().cloned());
        o
    }

    /// [`options`](Self::options) for NVRTC `version`: with `--split-compile=0` where that
    /// version takes it and no extra option chose a split already.
    fn options_for(&self, arch: &str, version: (i32, i32)) -> Vec<String> {
        let mut o = self.options(arch);
        let chosen = self.extra_options.iter().any(|x| x.trim_start_matches('-').starts_with("split-compile"));
        if takes_split_compile(version) && !chosen {
            o.insert(o.len() - self.include_paths.len() - self.extra_options.len(), SPLIT_COMPILE.to_string());
        }
        o
    }

    /// Compiles `source` (with the weave headers available) for `arch` (`sm_90`, `compute_90`,
    /// …), through the cache. Errors: [`Error::Unsupported`] without NVRTC,
    /// [`Error::InvalidArgument`] for a bad `arch` or a NUL byte in the source,
    /// [`Error::Cuda`] (`"nvrtc compile"`, message = NVRTC's log) when the source does not compile.
    pub fn compile(&self, source: &str, arch: &str) -> Result<CompiledKernel> {
        let (key, options, concrete) = self.key(source, arch)?;
        if let Some(hit) = self.cache_hit(key, arch, concrete) {
            return Ok(hit);
        }
        let out = nvrtc()?.compile(source, HEADERS, &options, concrete).map_err(|e| match e {
            NvrtcError::Compile { message, log } => Error::Cuda {
                operation: "nvrtc compile".into(),
                message: format!("{message} (options: {})\n{}", options.join(" "), log.trim_end()),
            },
            NvrtcError::Input(what) => Error::invalid(format!("{what} contains a NUL byte")),
            NvrtcError::Call { operation, message } => Error::Cuda { operation: operation.into(), message },
        })?;
        let (ptx, cubin, log) = (out.ptx, out.cubin, out.log);
        let cache = match &self.cache_dir {
            None => CacheOutcome::Disabled,
            Some(dir) => match store_entry(dir, key, &encode_entry(key, &ptx, cubin.as_deref())) {
                Ok(()) => CacheOutcome::Stored,
                Err(e) => CacheOutcome::NotStored(format!("{}: {e}", dir.display())),
            },
        };
        Ok(CompiledKernel { arch: arch.into(), ptx, cubin, key, log, cache })
    }
}

impl Compiler {
    /// What [`compile`](Self::compile) would find in the cache for `source` on `arch`, without
    /// compiling: `Ok(None)` on a miss (or without a cache).
    pub fn cached(&self, source: &str, arch: &str) -> Result<Option<CompiledKernel>> {
        let (key, _, concrete) = self.key(source, arch)?;
        Ok(self.cache_hit(key, arch, concrete))
    }

    /// The cache key of `source` on `arch`, the NVRTC options, and whether a cubin is wanted.
    fn key(&self, source: &str, arch: &str) -> Result<(u128, Vec<String>, bool)> {
        let concrete = check_arch(arch)?;
        if source.contains('\0') {
            return Err(Error::invalid("kernel source contains a NUL byte"));
        }
        let (major, minor) = nvrtc_version()?;
        let options = self.options_for(arch, (major, minor));
        let mut h = Fnv128::new();
        h.field(b"weave kernel cache key v1").field(source.as_bytes()).field(arch.as_bytes());
        for (name, text) in HEADERS {
            h.field(name.as_bytes()).field(text.as_bytes());
        }
        for o in &options {
            h.field(o.as_bytes());
        }
        h.field(&major.to_le_bytes()).field(&minor.to_le_bytes());
        Ok((h.0, options, concrete))
    }

    fn cache_hit(&self, key: u128, arch: &str, concrete: bool) -> Option<CompiledKernel> {
        let (ptx, cubin) = self.cache_dir.as_deref().and_then(|dir| read_entry(dir, key, concrete))?;
        Some(CompiledKernel { arch: arch.into(), ptx, cubin, key, log: String::new(), cache: CacheOutcome::Hit })
    }
}

/// Compiles `source` for `arch` with [`Compiler::from_env`] (the cache of
/// [`cache_dir_from_env`]). See [`Compiler::compile`].
pub fn compile(source: &str, arch: &str) -> Result<CompiledKernel> {
    Compiler::from_env().compile(source, arch)
}

/// Lower-case hex of a key, as used in cache file names.
pub fn key_hex(key: u128) -> String {
    let mut s = String::with_capacity(32);
    let _ = write!(s, "{key:032x}");
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use std::fs;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::source;
    use comm_core::device::Layout;

    /// True when NVRTC is here. Without it: panics under `CI` (so CI cannot skip the device-code
    /// compile), else prints a SKIPPED line and returns false.
    pub(crate) fn nvrtc_or_skip(test: &str) -> bool {
        if nvrtc_available() {
            return true;
        }
        if std::env::var_os("CI").is_some() {
            panic!(
                "{test}: NVRTC not found and CI is set: device code must compile in CI. Run the \
                 suite with `cargo xtask test`, which installs NVRTC and puts it on LD_LIBRARY_PATH"
            );
        }
        // Straight to stderr: the test harness captures print! output of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: NVRTC not found (set LD_LIBRARY_PATH to a libnvrtc.so.13 directory)"
        );
        false
    }

    fn temp_dir(name: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weave-kernels-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn arch_names_are_checked() {
        for good in ["sm_90", "sm_90a", "compute_90", "sm_100f", "compute_120a"] {
            assert!(check_arch(good).is_ok(), "{good}");
        }
        assert_eq!(check_arch("sm_90").ok(), Some(true));
        assert_eq!(check_arch("compute_90").ok(), Some(false));
        for bad in ["", "sm90", "sm_", "sm_9", "sm_90aa", "compute_x0", "gfx90a", "sm_90 -G"] {
            assert!(matches!(check_arch(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn cache_dir_is_off_without_a_directory() {
        assert_eq!(Compiler::without_cache().cache_dir(), None);
        let c = Compiler::with_cache_dir("/x").include_path("/usr/local/cuda/include").option("-DX=1");
        assert_eq!(c.cache_dir(), Some(Path::new("/x")));
        let o = c.options("sm_90");
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()) && o.contains(&"-std=c++17".to_string()));
        assert_eq!(o[o.len() - 2..], ["--include-path=/usr/local/cuda/include".to_string(), "-DX=1".to_string()]);
        assert_eq!(key_hex(0xab), format!("{}ab", "0".repeat(30)));
    }

    #[test]
    fn nvrtc_from_12_1_optimizes_in_parallel_unless_told_otherwise() {
        let c = Compiler::without_cache().include_path("/inc");
        let old = c.options_for("sm_90", (12, 0));
        assert_eq!(old, c.options("sm_90"));
        let new = c.options_for("sm_90", (13, 0));
        assert_eq!(new.len(), old.len() + 1);
        // Before the include paths and extra options, so those still come last.
        assert_eq!(new[new.len() - 2..], [SPLIT_COMPILE.to_string(), "--include-path=/inc".to_string()]);
        let own = Compiler::without_cache().option("--split-compile=4");
        assert_eq!(own.options_for("sm_90", (13, 0)), own.options("sm_90"));
        let own_short = Compiler::without_cache().option("-split-compile=1");
        assert_eq!(own_short.options_for("sm_90", (13, 0)), own_short.options("sm_90"));
    }

    #[test]
    fn bad_input_is_refused_before_nvrtc() {
        let c = Compiler::without_cache();
        assert!(matches!(c.compile("x", "sm90"), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.compile("a\0b", "sm_90"), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn missing_nvrtc_is_unsupported() {
        if nvrtc_available() {
            let _ = writeln!(std::io::stderr(), "SKIPPED: missing_nvrtc_is_unsupported: NVRTC is present here");
            return;
        }
        let e = Compiler::without_cache().compile("", "sm_90").unwrap_err();
        assert!(matches!(&e, Error::Unsupported(m) if m.contains("LD_LIBRARY_PATH")), "{e}");
    }

    /// The CI gate for device code: every header, every test kernel and every generated layout
    /// check compile to PTX (and CUBIN) for sm_90.
    #[test]
    fn primitives_program_compiles_for_sm_90() {
        if !nvrtc_or_skip("primitives_program_compiles_for_sm_90") {
            return;
        }
        let k = Compiler::without_cache()
            .compile(&source::primitives_test_program(), "sm_90")
            .unwrap_or_else(|e| panic!("device code does not compile:\n{e}"));
        assert!(k.ptx().contains(".target sm_90"), "PTX targets sm_90");
        for name in [
            "weave_test_copy",
            "weave_test_channel_copy",
            "weave_test_ll16",
            "weave_test_ll8",
            "weave_test_channel_packets",
            "weave_test_semaphore",
            "weave_test_semaphore_poll",
            "weave_test_timeout",
            "weave_test_fifo_push",
            "weave_test_trigger_encode",
            "weave_test_port_channel",
            "weave_test_dtype",
            "weave_test_reduce_vec",
        ] {
            assert!(k.ptx().contains(&format!(".entry {name}(")), "PTX lacks kernel {name}");
        }
        for instr in ["ld.acquire.sys.global.u64", "red.release.sys.global.add.u64", "st.volatile.global.v4.u32"] {
            assert!(k.ptx().contains(instr), "PTX lacks {instr}");
        }
        assert!(!k.ptx().contains("multimem"), "weave never uses NVLink multicast");
        let cubin = k.cubin().expect("sm_90 gives a CUBIN");
        assert_eq!(&cubin[..4], b"\x7fELF");
        assert_eq!(k.cache(), &CacheOutcome::Disabled);
        // compute_90: PTX only.
        let k = Compiler::without_cache().compile(&source::primitives_test_program(), "compute_90").unwrap();
        assert!(k.cubin().is_none() && k.ptx().contains(".target sm_90"));
    }

    #[test]
    fn compile_errors_carry_the_log() {
        if !nvrtc_or_skip("compile_errors_carry_the_log") {
            return;
        }
        let e = Compiler::without_cache()
            .compile(&source::program("__global__ void k() { undeclared_thing(); }"), "sm_90")
            .unwrap_err();
        match e {
            Error::Cuda { operation, message } => {
                assert_eq!(operation, "nvrtc compile");
                assert!(message.contains("undeclared_thing") && message.contains("kernel.cu(1)"), "{message}");
            }
            other => panic!("expected a CUDA error, got {other}"),
        }
    }

    #[test]
    fn a_wrong_layout_fails_compilation_naming_the_field() {
        if !nvrtc_or_skip("a_wrong_layout_fails_compilation_naming_the_field") {
            return;
        }
        let wrong = [Layout {
            name: "MemoryChannelDeviceHandle",
            size: 56,
            align: 8,
            fields: &[("semaphore", 0), ("dst", 24), ("src", 40), ("remote_packets", 40), ("local_packets", 48)],
        }];
        let checks = crate::layout::layout_checks(&wrong);
        let e = Compiler::without_cache()
            .compile(&source::program_with_checks("", &checks), "sm_90")
            .expect_err("a wrong offset must fail the compile");
        let text = e.to_string();
        assert!(text.contains("offset of MemoryChannelDeviceHandle.src differs from Rust (40)"), "{text}");
        assert!(!text.contains("MemoryChannelDeviceHandle.dst differs"), "{text}");
        let wrong_size = [Layout { name: "LL16Packet", size: 32, align: 16, fields: &[] }];
        let e = Compiler::without_cache()
            .compile(&source::program_with_checks("", &crate::layout::layout_checks(&wrong_size)), "sm_90")
            .expect_err("a wrong size must fail the compile");
        assert!(e.to_string().contains("sizeof(LL16Packet) differs from Rust (32 bytes)"), "{e}");
        // The right layouts compile.
        Compiler::without_cache().compile(&source::program(""), "sm_90").unwrap();
    }

    #[test]
    fn cache_hits_misses_and_rebuilds_corrupt_entries() {
        if !nvrtc_or_skip("cache_hits_misses_and_rebuilds_corrupt_entries") {
            return;
        }
        let dir = temp_dir("cache");
        let c = Compiler::with_cache_dir(&dir);
        let src = source::program("extern \"C\" __global__ void cache_probe(unsigned* p) { *p = 1; }");
        let first = c.compile(&src, "sm_90").unwrap();
        assert_eq!(first.cache(), &CacheOutcome::Stored);
        let path = entry_path(&dir, first.key());
        assert!(path.is_file());
        let hit = c.compile(&src, "sm_90").unwrap();
        assert_eq!(hit.cache(), &CacheOutcome::Hit);
        assert_eq!((hit.ptx(), hit.cubin(), hit.key()), (first.ptx(), first.cubin(), first.key()));
        // Another source, arch or option is another key.
        let other = c.compile(&src.replace("= 1;", "= 2;"), "sm_90").unwrap();
        assert_eq!(other.cache(), &CacheOutcome::Stored);
        assert_ne!(other.key(), first.key());
        let ptx_only = c.compile(&src, "compute_90").unwrap();
        assert_eq!(ptx_only.cache(), &CacheOutcome::Stored);
        assert_ne!(ptx_only.key(), first.key());
        let with_option = c.clone().option("-DWEAVE_PROBE=1").compile(&src, "sm_90").unwrap();
        assert_ne!(with_option.key(), first.key());
        // A corrupt entry is ignored and rebuilt.
        let mut data = fs::read(&path).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        fs::write(&path, &data).unwrap();
        let rebuilt = c.compile(&src, "sm_90").unwrap();
        assert_eq!(rebuilt.cache(), &CacheOutcome::Stored);
        assert_eq!(rebuilt.ptx(), first.ptx());
        assert_eq!(c.compile(&src, "sm_90").unwrap().cache(), &CacheOutcome::Hit);
        fs::write(&path, b"garbage").unwrap();
        assert_eq!(c.compile(&src, "sm_90").unwrap().cache(), &CacheOutcome::Stored);
        // No temporary files are left behind.
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // An unwritable cache does not fail the compile.
        let blocked = dir.join("blocked");
        fs::write(&blocked, b"a file, not a directory").unwrap();
        let k = Compiler::with_cache_dir(&blocked).compile(&src, "sm_90").unwrap();
        assert!(matches!(k.cache(), CacheOutcome::NotStored(_)), "{:?}", k.cache());
        fs::remove_dir_all(&dir).unwrap();
    }
}
