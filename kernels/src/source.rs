//! The CUDA C++ sources compiled into the crate, and the assembly of a full NVRTC program.
//!
//! The device headers (`kernels/cuda/weave/*.cuh`) are embedded with `include_str!` and given
//! to NVRTC as named headers, so a kernel writes `#include "weave/weave.cuh"` (or one header)
//! and compiler messages point into the right file and line. [`program`] puts that include in
//! front of a kernel's source and appends the generated layout checks ([`crate::layout`]).

pub use crate::program_text::{HEADERS, KERNEL_FILE_NAME, program_with_checks};

/// The test kernels for every primitive (`kernels/cuda/primitives_test.cu`); compile them with
/// [`program`] (see [`primitives_test_program`]).
pub const PRIMITIVES_TEST: &str = include_str!("../cuda/primitives_test.cu");

/// A complete NVRTC program: `#include "weave/weave.cuh"`, then `extra_source` (reported as
/// [`KERNEL_FILE_NAME`] from line 1), then the layout and protocol checks generated from
/// comm-core ([`crate::layout::static_checks`]), so a drift between the Rust handles and their
/// C++ mirrors fails the compile.
pub fn program(extra_source: &str) -> String {
    program_with_checks(extra_source, &crate::layout::static_checks())
}

/// [`program`] of [`PRIMITIVES_TEST`].
pub fn primitives_test_program() -> String {
    program(PRIMITIVES_TEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_header_is_listed_and_guarded() {
        let all = HEADERS.iter().find(|(n, _)| *n == "weave/weave.cuh").map(|h| h.1).unwrap_or_default();
        for (name, text) in HEADERS {
            assert!(!text.contains('\0'), "{name} contains a NUL byte");
            let guard = format!("#ifndef WEAVE_{}", name.trim_start_matches("weave/").replace('.', "_").to_uppercase());
            assert!(text.contains(&guard), "{name} lacks its include guard {guard}");
            if *name != "weave/weave.cuh" {
                assert!(all.contains(&format!("#include \"{name}\"")), "weave.cuh does not include {name}");
            }
            // Every include inside a header names an embedded header.
            for line in text.lines().filter(|l| l.trim_start().starts_with("#include")) {
                let included = line.split('"').nth(1).unwrap_or("");
                assert!(HEADERS.iter().any(|(n, _)| *n == included), "{name}: {line} is not an embedded header");
            }
        }
    }

    #[test]
    fn program_has_include_source_and_checks() {
        let p = program("extern \"C\" __global__ void k() {}");
        assert!(p.starts_with("#include \"weave/weave.cuh\"\n"));
        assert!(p.contains("void k() {}\n#line 1 \"weave-generated-checks\"\n"));
        assert!(p.contains("static_assert(sizeof(::weave::MemoryChannelDeviceHandle) == 56"));
    }
}
