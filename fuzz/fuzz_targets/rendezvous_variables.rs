//! A launcher's rendezvous variables (torchrun, Open MPI, Slurm, `WEAVE_SECRET`), as lines of
//! `NAME=VALUE`: an error or a rendezvous, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    comm_core::fuzzing::rendezvous_variables(data);
});
