//! A TCP region's export payload from a peer's memory descriptor: see `transport_tcp::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_tcp::fuzzing::region_export(data);
});
