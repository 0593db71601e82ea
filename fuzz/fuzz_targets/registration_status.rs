//! A peer's status in a registration handshake: see `comm_core::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| comm_core::fuzzing::registration_status(data));
