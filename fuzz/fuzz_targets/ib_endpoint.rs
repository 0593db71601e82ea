//! A rank's InfiniBand endpoint (port and queue pairs): see `transport_ib::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_ib::fuzzing::endpoint(data);
});
