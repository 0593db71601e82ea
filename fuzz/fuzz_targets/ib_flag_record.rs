//! An InfiniBand flag record a peer sends with a store: see `transport_ib::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_ib::fuzzing::flag_record(data);
});
