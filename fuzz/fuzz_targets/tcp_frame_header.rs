//! A TCP frame header as a peer's socket delivers it: see `transport_tcp::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_tcp::fuzzing::frame_header(data);
});
