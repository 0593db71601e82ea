//! A shared-memory segment's export payload: see `transport_shm::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_shm::fuzzing::segment_export(data);
});
