//! Errors at the C boundary: weave errors turned into `ncclResult_t`, the message kept for
//! `ncclGetLastError`, `NCCL_DEBUG` logging, and [`guard`], which every exported function runs
//! its body in so that no panic crosses into C.
//!
//! weave's error kinds map to NCCL's codes as follows (documented in the crate docs too):
//!
//! | weave error | `ncclResult_t` |
//! |---|---|
//! | `InvalidArgument` | `ncclInvalidArgument` |
//! | `Unsupported`, `RegistrationMismatch` | `ncclInvalidUsage` |
//! | `PeerLost`, `Protocol` | `ncclRemoteError` (a peer died, or sent garbage) |
//! | `Timeout`, `Transport`, `Io`, `Aborted` | `ncclSystemError` |
//! | `Cuda` | `ncclUnhandledCudaError` |
//! | a panic inside this library | `ncclInternalError` |

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use comm_core::Error;

use crate::abi::NcclResult;

/// A failed call: the code to return and what to tell the user.
#[derive(Debug, Clone)]
pub struct Fail {
    /// The code returned to C.
    pub code: NcclResult,
    /// What failed, where, and what to do.
    pub message: String,
}

impl Fail {
    /// A failure with `code` and `message`.
    pub fn new(code: NcclResult, message: impl Into<String>) -> Self {
        Fail { code, message: message.into() }
    }

    /// `ncclInvalidArgument` with `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Fail::new(NcclResult::INVALID_ARGUMENT, message)
    }

    /// `ncclInvalidUsage` with `message`.
    pub fn usage(message: impl Into<String>) -> Self {
        Fail::new(NcclResult::INVALID_USAGE, message)
    }

    /// Prefixes the message with the name of the call.
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

/// The `ncclResult_t` of a weave error.
pub fn code_of(e: &Error) -> NcclResult {
    match e {
        Error::InvalidArgument(_) => NcclResult::INVALID_ARGUMENT,
        // After ncclCommRevoke NCCL's collectives return ncclInvalidUsage.
        Error::Unsupported(_) | Error::RegistrationMismatch(_) | Error::Revoked(_) => NcclResult::INVALID_USAGE,
        Error::PeerLost { .. } | Error::Protocol(_) => NcclResult::REMOTE_ERROR,
        Error::Cuda { .. } => NcclResult::UNHANDLED_CUDA_ERROR,
        _ => NcclResult::SYSTEM_ERROR,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail { code: code_of(&e), message: e.to_string() }
    }
}

/// Result of the body of an exported function.
pub type CallResult = std::result::Result<(), Fail>;

/// Logs `message` at WARN the first time `symbol` is called (for calls this library refuses).
pub fn warn_once(symbol: &'static str, message: &str) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let first = match SEEN.lock() {
        Ok(mut seen) => seen.get_or_insert_with(HashSet::new).insert(symbol),
        Err(_) => false,
    };
    if first {
        tracing::warn!(target: crate::debug::NCCL, "{symbol}: {message}");
    }
}

/// The last failure of any thread (for `ncclGetLastError` on a thread where nothing failed).
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

thread_local! {
    /// The last failure of a call made on this thread: what `ncclGetLastError` reports first,
    /// as NCCL keeps its last error per thread, so that another thread's failure in between
    /// does not hide it.
    static LAST_ON_THIS_THREAD: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The string `ncclGetLastError` last handed out on this thread (valid until this thread's
    /// next `ncclGetLastError`).
    static HANDED_OUT: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as the last error of this thread and of the process.
pub fn set_last_error(message: &str) {
    LAST_ON_THIS_THREAD.with(|last| *last.borrow_mut() = Some(message.to_owned()));
    if let Ok(mut last) = LAST_ERROR.lock() {
        last.clear();
        last.push_str(message);
    }
}

/// The last error as a C string owned by this thread, valid until this thread calls this
/// again: `preferred` when given, else this thread's last failure, else the process's (empty
/// when nothing failed).
pub fn last_error_ptr(preferred: Option<String>) -> *const c_char {
    let text = preferred
        .or_else(|| LAST_ON_THIS_THREAD.with(|last| last.borrow().clone()))
        .unwrap_or_else(|| LAST_ERROR.lock().map(|s| s.clone()).unwrap_or_default());
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    HANDED_OUT.with(|h| {
        *h.borrow_mut() = c;
        h.borrow().as_ptr()
    })
}

/// Runs the body of exported function `name`: a failure is logged, recorded and turned into
/// its code; a panic becomes `ncclInternalError`. The caller's current CUDA context (its
/// current device) is the same after the call as before, as NCCL keeps it, though weave binds
/// the communicator's context to run the call.
pub fn guard(name: &'static str, body: impl FnOnce() -> CallResult) -> NcclResult {
    crate::debug::install_subscriber_once();
    let _callers_context = crate::cuda::SavedContext::save();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::SUCCESS,
        Ok(Err(fail)) => report(name, fail),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            report(
                name,
                Fail::new(NcclResult::INTERNAL_ERROR, format!("internal error (panic: {what}); please report it")),
            )
        }
    }
}

/// Logs and records `fail` of `name`, returning its code (`ncclInProgress` is no failure).
pub fn report(name: &str, fail: Fail) -> NcclResult {
    if fail.code == NcclResult::IN_PROGRESS || fail.code == NcclResult::SUCCESS {
        return fail.code;
    }
    let message = format!("{name} failed ({}): {}", error_string(fail.code), fail.message);
    tracing::warn!(target: crate::debug::NCCL, "{message}");
    set_last_error(&message);
    fail.code
}

/// `ncclGetErrorString`'s text for `code`, as NCCL words it.
pub fn error_string(code: NcclResult) -> &'static str {
    error_cstr(code).to_str().unwrap_or("unknown result code")
}

/// [`error_string`] as a static C string.
pub fn error_cstr(code: NcclResult) -> &'static CStr {
    match code {
        NcclResult::SUCCESS => c"no error",
        NcclResult::UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NcclResult::SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NcclResult::INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NcclResult::INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NcclResult::INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NcclResult::REMOTE_ERROR => c"remote process exited or there was a network error",
        NcclResult::IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_strings_name_each_code() {
        assert_eq!(error_string(NcclResult::SUCCESS), "no error");
        assert!(error_string(NcclResult::REMOTE_ERROR).starts_with("remote process exited"));
        assert_eq!(error_string(NcclResult::IN_PROGRESS), "NCCL operation in progress");
        assert_eq!(error_string(NcclResult(99)), "unknown result code");
        assert_eq!(error_string(NcclResult(-1)), "unknown result code");
    }

    #[test]
    fn weave_errors_map_to_nccl_codes() {
        assert_eq!(code_of(&Error::invalid("x")), NcclResult::INVALID_ARGUMENT);
        assert_eq!(code_of(&Error::peer_lost(1, "wait", "gone")), NcclResult::REMOTE_ERROR);
        assert_eq!(code_of(&Error::Unsupported("x".into())), NcclResult::INVALID_USAGE);
        assert_eq!(
            code_of(&Error::Cuda { operation: "launch".into(), message: "bad".into() }),
            NcclResult::UNHANDLED_CUDA_ERROR
        );
        assert_eq!(code_of(&Error::Aborted("x".into())), NcclResult::SYSTEM_ERROR);
    }

    #[test]
    fn guard_turns_panics_into_internal_errors_and_records_the_message() {
        let r = guard("ncclTest", || panic!("boom"));
        assert_eq!(r, NcclResult::INTERNAL_ERROR);
        let r = guard("ncclTest", || Err(Fail::invalid("count too large")));
        assert_eq!(r, NcclResult::INVALID_ARGUMENT);
        let p = last_error_ptr(None);
        // SAFETY: last_error_ptr returns a live NUL-terminated string owned by this thread.
        let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        assert!(text.contains("count too large") || text.contains("ncclTest"), "{text}");
        assert_eq!(guard("ncclTest", || Ok(())), NcclResult::SUCCESS);
    }

    #[test]
    fn a_thread_reads_its_own_last_failure_not_another_threads() {
        set_last_error("failure of this thread");
        std::thread::spawn(|| set_last_error("failure of another thread")).join().unwrap();
        let p = last_error_ptr(None);
        // SAFETY: last_error_ptr returns a live NUL-terminated string owned by this thread.
        let here = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        assert_eq!(here, "failure of this thread");
        let elsewhere = std::thread::spawn(|| {
            // SAFETY: as above, on the thread that read it.
            unsafe { CStr::from_ptr(last_error_ptr(None)) }.to_string_lossy().into_owned()
        })
        .join()
        .unwrap();
        // Other tests of this process fail calls too: the process's last failure is someone's.
        assert!(!elsewhere.is_empty(), "a thread where nothing failed reads the process's last failure");
    }
}
