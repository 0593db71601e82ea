//! An agreement message of a communicator of `size` members (the first two bytes choose the
//! size, the rest is the message): decoding never panics, names no member outside the
//! communicator, and whatever decodes encodes back to the same message.
#![no_main]

use comm_core::agreement::AgreementMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((size, message)) = data.split_first_chunk::<2>() else { return };
    let size = usize::from(u16::from_le_bytes(*size)).max(1);
    if let Ok(m) = AgreementMessage::decode(message, size) {
        let members = m.view.iter().chain(m.value.iter().flatten());
        assert!(members.into_iter().all(|&r| r < size), "{m:?} names a member outside {size}");
        let again = AgreementMessage::decode(&m.encode(size), size).expect("a decoded message re-encodes");
        assert_eq!(again, m);
    }
});
