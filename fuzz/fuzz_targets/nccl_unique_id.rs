//! An `ncclUniqueId` (128 bytes handed between processes by the application): decoding never
//! panics, and an accepted id is the one encoding of what it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nccl::abi::{NcclUniqueId, UNIQUE_ID_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some(bytes) = data.first_chunk::<UNIQUE_ID_BYTES>() else { return };
    let id = NcclUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) };
    if let Ok(unique) = nccl::unique_id::decode(&id) {
        let again = nccl::unique_id::encode(&unique).expect("a decoded id encodes");
        assert_eq!(again.internal, id.internal, "an accepted id encodes back differently");
    }
});
