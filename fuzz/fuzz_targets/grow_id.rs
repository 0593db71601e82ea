//! A grow id, as bytes and as text handed to joiners: see `collectives::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    collectives::fuzzing::grow_id(data);
});
