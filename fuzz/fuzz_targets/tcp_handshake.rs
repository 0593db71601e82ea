//! The handshake a socket opens with at a rank's TCP listener (anyone may connect): see
//! `transport_tcp::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_tcp::fuzzing::handshake(data);
});
