//! A rank's TCP endpoint from the endpoint exchange: see `transport_tcp::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_tcp::fuzzing::endpoint(data);
});
