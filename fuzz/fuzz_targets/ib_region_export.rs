//! An InfiniBand region's export (address, key, length, number): see `transport_ib::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_ib::fuzzing::region_export(data);
});
