//! A range of the user's device memory that belongs to one communicator: what a window
//! (`windowed.rs`) and a registration (`registered.rs`) have in common — where it is, whose it
//! is, and whether a call's buffer lies inside it.

use comm_core::{Error, Result};

/// `len` bytes of the user's device memory at `address`, given to communicator `communicator`.
pub(crate) struct UserRange {
    /// The id of the communicator it was given to.
    pub(crate) communicator: u64,
    /// This rank's device address.
    pub(crate) address: u64,
    /// Its length in bytes.
    pub(crate) len: usize,
}

impl UserRange {
    /// Whether `[address, address + len)` lies inside this range; the offset if so.
    pub(crate) fn offset_of(&self, address: u64, len: usize) -> Option<u64> {
        let offset = address.checked_sub(self.address)?;
        (offset.checked_add(len as u64)? <= self.len as u64).then_some(offset)
    }

    /// Errors unless communicator `communicator` owns this range; `what` names it in the error
    /// ("window", "registration").
    pub(crate) fn check_owner(&self, communicator: u64, what: &str) -> Result<()> {
        if self.communicator != communicator {
            return Err(Error::invalid(format!(
                "{what} of {:#x} ({} bytes) belongs to another communicator; a {what} is valid only on the \
                 communicator that made it (give the memory to this one too)",
                self.address, self.len
            )));
        }
        Ok(())
    }

    /// Formats the range as `name { address, len, zero_copy }`.
    pub(crate) fn debug(&self, name: &str, zero_copy: bool, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("address", &format_args!("{:#x}", self.address))
            .field("len", &self.len)
            .field("zero_copy", &zero_copy)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holds_a_buffer_only_whole_and_names_its_owner() {
        let r = UserRange { communicator: 1, address: 0x1000, len: 256 };
        assert_eq!(r.offset_of(0x1000, 256), Some(0));
        assert_eq!(r.offset_of(0x1010, 16), Some(0x10));
        assert_eq!(r.offset_of(0x1100, 0), Some(0x100), "an empty range at the end");
        assert_eq!(r.offset_of(0x1001, 256), None, "runs past the end");
        assert_eq!(r.offset_of(0xfff, 1), None, "starts before");
        assert_eq!(r.offset_of(u64::MAX, usize::MAX), None, "overflow is no match");
        r.check_owner(1, "window").unwrap();
        let e = r.check_owner(2, "window").unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("another communicator")), "{e}");
    }
}
