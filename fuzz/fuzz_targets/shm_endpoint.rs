//! A rank's shared-memory endpoint (process identity, device, node): see `transport_shm::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_shm::fuzzing::endpoint(data);
});
