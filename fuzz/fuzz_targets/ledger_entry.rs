//! A ledger entry from a peer (`LedgerAnswer` notices): decoding never panics, and whatever
//! decodes encodes back to the same entry.
#![no_main]

use comm_core::ledger::LedgerEntry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = LedgerEntry::decode(data) {
        let again = LedgerEntry::decode(&entry.encode()).expect("a decoded entry re-encodes to a valid one");
        assert_eq!(again, entry);
    }
});
