//! A survivor's offer when a shrink begins: see `collectives::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    collectives::fuzzing::shrink_offer(data);
});
