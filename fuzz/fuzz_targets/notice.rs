//! A notice from any member of the job (revocations, agreement messages, ledger questions and
//! answers): decoding never panics, and whatever decodes encodes back to the same bytes.
#![no_main]

use comm_core::notice::{decode_notice, encode_notice};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((kind, namespace, body)) = decode_notice(data) {
        assert_eq!(encode_notice(kind, namespace, &body), data);
    }
});
