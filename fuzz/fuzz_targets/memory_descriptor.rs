//! A registered-memory descriptor from a peer (the exchange of every registration): decoding
//! never panics, and whatever decodes encodes back to the same descriptor.
#![no_main]

use comm_core::memory::MemoryDescriptor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = MemoryDescriptor::decode(data) {
        let again = MemoryDescriptor::decode(&d.encode()).expect("a decoded descriptor re-encodes");
        assert_eq!(again, d);
    }
});
