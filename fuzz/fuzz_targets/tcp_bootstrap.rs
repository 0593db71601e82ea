//! The TCP bootstrap's messages as a stranger could send them to a listening rank (hello,
//! acknowledgement, group and rank tables, peer hello): see `comm_core::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    comm_core::fuzzing::tcp_bootstrap_message(data);
});
