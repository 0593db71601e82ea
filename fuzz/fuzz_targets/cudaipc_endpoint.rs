//! A rank's CUDA IPC endpoint: see `transport_cudaipc::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_cudaipc::fuzzing::endpoint(data);
});
