//! Weave-allocated shared buffers: host memory every rank of a communicator maps, so
//! collectives read it in place instead of staging it.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use comm_core::memory::RegisteredMemory;

use crate::dtype::Element;

/// `len` elements of `T` in shared memory, allocated collectively with
/// [`Communicator::alloc_shared`](crate::Communicator::alloc_shared).
///
/// It dereferences to a slice; pass it (or a sub-slice of it) to a collective of the same
/// communicator and peers read it where it is — no copy into scratch. Use it with other
/// communicators like any slice (staged). Peers only read it inside collective calls that this
/// rank is also in, so ordinary reads and writes between calls are safe. The memory stays
/// mapped until the communicator is dropped (peers may read it in any later call).
pub struct SharedBuffer<T: Element> {
    memory: RegisteredMemory,
    len: usize,
    _elements: PhantomData<T>,
}

// SAFETY: the buffer owns a mapping that lives as long as `memory`; access goes through `&self`
// / `&mut self` like a Vec<T>, and T is Send + Sync.
unsafe impl<T: Element> Send for SharedBuffer<T> {}
// SAFETY: shared access only hands out `&[T]`; see Send.
unsafe impl<T: Element> Sync for SharedBuffer<T> {}

impl<T: Element> SharedBuffer<T> {
    /// Wraps a local host registration of at least `len * size_of::<T>()` bytes (zero-filled).
    pub(crate) fn new(memory: RegisteredMemory, len: usize) -> Self {
        debug_assert!(memory.len() >= len * std::mem::size_of::<T>() && memory.is_host_mapped());
        SharedBuffer { memory, len, _elements: PhantomData }
    }

    /// The registration behind the buffer.
    pub fn memory(&self) -> &RegisteredMemory {
        &self.memory
    }
}

impl<T: Element> Deref for SharedBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the mapping is page-aligned, holds len elements, was zero-filled (a valid bit
        // pattern for every Element type) and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.memory.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref; &mut self makes this the only Rust reference. Peers read the
        // memory only inside collective calls, which need a borrow of it too.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer").field("len", &self.len).field("dtype", &T::DTYPE).finish()
    }
}
