//! NVRTC, loaded at run time with `libloading`, from `std` and `libloading` alone (the build
//! script compiles with it too): which library to load, and the calls weave makes.
//!
//! A driver runs code from an NVRTC of its own CUDA major version or an older one, not a newer
//! one (a CUDA 12 driver rejects CUDA 13 PTX and cubins), so [`library_candidates`] never offers
//! an NVRTC newer than the driver, and prefers the driver's own.

use std::ffi::{CString, c_char, c_int, c_void};
use std::fmt;

/// `nvrtcResult`: 0 is success.
type NvrtcResult = c_int;
/// `nvrtcProgram`.
type Program = *mut c_void;

/// NVRTC major versions weave compiles with, newest first.
pub const SUPPORTED_MAJORS: [i32; 2] = [13, 12];

/// Library names to try for a driver of CUDA major version `driver_major` (`None`: no driver
/// here, e.g. a build machine): the versioned sonames of the driver's major and older ones,
/// newest first, then the unversioned `libnvrtc.so` (a toolkit's development link, whose
/// version [`Nvrtc::open`] checks after loading it).
pub fn library_candidates(driver_major: Option<i32>) -> Vec<String> {
    let mut names: Vec<String> = SUPPORTED_MAJORS
        .iter()
        .filter(|&&m| driver_major.is_none_or(|d| m <= d))
        .map(|m| format!("libnvrtc.so.{m}"))
        .collect();
    names.push("libnvrtc.so".to_string());
    names
}

/// What went wrong in an NVRTC call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvrtcError {
    /// A call other than the compile failed: the call and its result code's name.
    Call {
        /// The NVRTC function.
        operation: &'static str,
        /// `nvrtcGetErrorString` of the result.
        message: String,
    },
    /// The program did not compile: the result's name and NVRTC's log.
    Compile {
        /// `nvrtcGetErrorString` of the result.
        message: String,
        /// NVRTC's log.
        log: String,
    },
    /// The input cannot be handed to NVRTC (a NUL byte in it).
    Input(String),
}

impl fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvrtcError::Call { operation, message } => write!(f, "{operation} failed: {message}"),
            NvrtcError::Compile { message, log } => write!(f, "nvrtcCompileProgram failed: {message}\n{log}"),
            NvrtcError::Input(what) => write!(f, "{what} contains a NUL byte"),
        }
    }
}

/// What one compile produced.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    /// PTX text.
    pub ptx: String,
    /// The CUBIN, when asked for (targets `sm_XX`).
    pub cubin: Option<Vec<u8>>,
    /// NVRTC's log (warnings).
    pub log: String,
}

/// A loaded NVRTC library and the functions weave calls.
pub struct Nvrtc {
    name: String,
    version: (i32, i32),
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    /// Keeps the functions above loaded; dropped last.
    _library: libloading::Library,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc").field("name", &self.name).field("version", &self.version).finish()
    }
}

/// Destroys a program on drop.
struct ProgramGuard<'a>(&'a Nvrtc, Program);

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram of this library and is destroyed
        // once, here. A failure leaks a little host memory; nothing to do about it.
        let _ = unsafe { (self.0.destroy)(&mut self.1) };
    }
}

impl Nvrtc {
    /// Loads the first of `candidates` (names or paths) that loads, has every function weave
    /// calls, and is no newer than `driver_major` (when given). The error lists what was tried.
    pub fn open(candidates: &[String], driver_major: Option<i32>) -> Result<Nvrtc, String> {
        let mut tried = Vec::new();
        for name in candidates {
            match Self::open_one(name) {
                Ok(n) if driver_major.is_some_and(|d| n.version.0 > d) => tried.push(format!(
                    "{name}: NVRTC {}.{} is newer than the driver (CUDA {}), which cannot run its code",
                    n.version.0,
                    n.version.1,
                    driver_major.unwrap_or_default()
                )),
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(tried.join("; "))
    }

    fn open_one(name: &str) -> Result<Nvrtc, String> {
        // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
        let library = unsafe { libloading::Library::new(name) }.map_err(|e| e.to_string())?;
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: the symbol is NVRTC's function of that name, whose C signature is the
                // field's type (nvrtc.h, stable since CUDA 11.2 for every function used here).
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult = symbol!("nvrtcVersion");
        let mut nvrtc = Nvrtc {
            name: name.to_string(),
            version: (0, 0),
            create: symbol!("nvrtcCreateProgram"),
            destroy: symbol!("nvrtcDestroyProgram"),
            compile: symbol!("nvrtcCompileProgram"),
            error_string: symbol!("nvrtcGetErrorString"),
            log_size: symbol!("nvrtcGetProgramLogSize"),
            log: symbol!("nvrtcGetProgramLog"),
            ptx_size: symbol!("nvrtcGetPTXSize"),
            ptx: symbol!("nvrtcGetPTX"),
            cubin_size: symbol!("nvrtcGetCUBINSize"),
            cubin: symbol!("nvrtcGetCUBIN"),
            _library: library,
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both pointers are valid for writes.
        let r = unsafe { version_fn(&mut major, &mut minor) };
        if r != 0 {
            return Err(format!("nvrtcVersion failed: {}", nvrtc.message(r)));
        }
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// The name or path it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its version as (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn message(&self, r: NvrtcResult) -> String {
        // SAFETY: nvrtcGetErrorString takes any code and returns a static string or null.
        let p = unsafe { (self.error_string)(r) };
        if p.is_null() {
            return format!("NVRTC error {r}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn call(&self, operation: &'static str, r: NvrtcResult) -> Result<(), NvrtcError> {
        if r == 0 { Ok(()) } else { Err(NvrtcError::Call { operation, message: self.message(r) }) }
    }

    /// Reads a buffer NVRTC fills after reporting its size (any trailing NUL removed when `text`).
    fn buffer(
        &self,
        program: Program,
        operation: &'static str,
        size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        fill: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
        text: bool,
    ) -> Result<Vec<u8>, NvrtcError> {
        let mut len = 0usize;
        // SAFETY: `program` is live; `len` is valid for writes.
        self.call(operation, unsafe { size(program, &mut len) })?;
        let mut buf = vec![0u8; len];
        if len > 0 {
            // SAFETY: `buf` has exactly the `len` bytes NVRTC asked for.
            self.call(operation, unsafe { fill(program, buf.as_mut_ptr().cast::<c_char>()) })?;
        }
        if text {
            while buf.last() == Some(&0) {
                buf.pop();
            }
        }
        Ok(buf)
    }

    /// Compiles `source` (named `weave_program.cu`) with the named `headers` and `options`;
    /// with the CUBIN when `want_cubin`.
    pub fn compile(
        &self,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
        want_cubin: bool,
    ) -> Result<NvrtcOutput, NvrtcError> {
        let c = |what: &str, s: &str| CString::new(s).map_err(|_| NvrtcError::Input(what.to_string()));
        let src = c("kernel source", source)?;
        let name = c("program name", "weave_program.cu")?;
        let header_names = headers.iter().map(|(n, _)| c("a header name", n)).collect::<Result<Vec<_>, _>>()?;
        let header_texts = headers.iter().map(|(n, t)| c(n, t)).collect::<Result<Vec<_>, _>>()?;
        let option_cs = options.iter().map(|o| c("a compile option", o)).collect::<Result<Vec<_>, _>>()?;
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
        let option_ptrs: Vec<*const c_char> = option_cs.iter().map(|s| s.as_ptr()).collect();
        let mut raw: Program = std::ptr::null_mut();
        // SAFETY: every pointer refers to a NUL-terminated string alive until after the program
        // is destroyed (the CStrings live to the end of this function, the guard drops first);
        // the header arrays have headers.len() entries each.
        let r = unsafe {
            (self.create)(
                &mut raw,
                src.as_ptr(),
                name.as_ptr(),
                text_ptrs.len() as c_int,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        self.call("nvrtcCreateProgram", r)?;
        let program = ProgramGuard(self, raw);
        // SAFETY: the program is live; the option array holds option_ptrs.len() C strings.
        let compiled = unsafe { (self.compile)(program.1, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        let log = self
            .buffer(program.1, "nvrtcGetProgramLog", self.log_size, self.log, true)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        if compiled != 0 {
            return Err(NvrtcError::Compile { message: self.message(compiled), log });
        }
        let ptx = self.buffer(program.1, "nvrtcGetPTX", self.ptx_size, self.ptx, true)?;
        let ptx = String::from_utf8(ptx)
            .map_err(|_| NvrtcError::Call { operation: "nvrtcGetPTX", message: "the PTX is not UTF-8".into() })?;
        let cubin = if want_cubin {
            let c = self.buffer(program.1, "nvrtcGetCUBIN", self.cubin_size, self.cubin, false)?;
            (!c.is_empty()).then_some(c)
        } else {
            None
        };
        Ok(NvrtcOutput { ptx, cubin, log })
    }
}

/// The first NVRTC version that takes `--split-compile` (run the optimizer in parallel).
const SPLIT_COMPILE_FROM: (i32, i32) = (12, 1);

/// Lets NVRTC optimize on every core, which shortens the compile of the collective program
/// (≈ 90 kernels) the more cores the host has (timings in docs/perf-log/gpu.md, "GPUs: weave vs
/// NCCL on H200s"); the kernels are the same code (instructions may be ordered or numbered
/// differently).
pub const SPLIT_COMPILE: &str = "--split-compile=0";

/// The options every weave program is compiled with for `arch`: `-std=c++17`,
/// `--gpu-architecture=<arch>`, `-default-device`, `--dopt=on`, `-lineinfo`.
pub fn base_options(arch: &str) -> Vec<String> {
    vec![
        "-std=c++17".to_string(),
        format!("--gpu-architecture={arch}"),
        "-default-device".to_string(),
        "--dopt=on".to_string(),
        "-lineinfo".to_string(),
    ]
}

/// Whether NVRTC `version` takes [`SPLIT_COMPILE`].
pub fn takes_split_compile(version: (i32, i32)) -> bool {
    version >= SPLIT_COMPILE_FROM
}
