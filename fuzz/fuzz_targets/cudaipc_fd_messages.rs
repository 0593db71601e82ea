//! What a local process sends the CUDA IPC FD server, and what the server answers: see
//! `transport_cudaipc::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    transport_cudaipc::fuzzing::fd_messages(data);
});
