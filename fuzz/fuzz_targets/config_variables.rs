//! The communicator's `WEAVE_*` settings, as lines of `NAME=VALUE`: an error or a config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    comm_core::fuzzing::config_variables(data);
});
