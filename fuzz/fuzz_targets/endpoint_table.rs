//! A rank's endpoint table, exchanged when a communicator is built: see `comm_core::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| comm_core::fuzzing::endpoint_table(data));
