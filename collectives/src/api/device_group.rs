//! Safe typed point-to-point calls on cudarc buffers: [`Communicator::send_device`],
//! [`Communicator::recv_device`] and groups of them ([`DeviceGroup`]), over
//! [`sendrecv_device_raw`](Communicator::sendrecv_device_raw).

use std::sync::Arc;

use comm_core::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::device_checks as checks;
use crate::api::communicator::Communicator;
use crate::call::DeviceTransfer;
use crate::dtype::Element;

impl Communicator {
    /// Sends `buf` to `peer` on `stream` (which must call [`recv_device`](Self::recv_device),
    /// or a group's `recv`, with the same length).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let activations = stream.alloc_zeros::<f32>(4096)?;
    /// comm.send_device(&activations, (comm.rank() + 1) % comm.world_size(), stream)?;
    /// # Ok(()) }
    /// ```
    pub fn send_device<T: Element, S: DevicePtr<T>>(
        &self,
        buf: &S,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.run_one(stream, |g| g.send(buf, peer))
    }

    /// Receives exactly `buf.len()` elements from `peer` into `buf`, on `stream` (a length other
    /// than the sender's is a device error, [`check_gpu`](Self::check_gpu)).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut activations = stream.alloc_zeros::<f32>(4096)?;
    /// let n = comm.world_size();
    /// comm.recv_device(&mut activations, (comm.rank() + n - 1) % n, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn recv_device<T: Element, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.run_one(stream, |g| g.recv(buf, peer))
    }

    /// Runs a group of the one transfer that `add` puts into it.
    fn run_one<'a, T: Element>(
        &'a self,
        stream: &'a Arc<CudaStream>,
        add: impl for<'g> FnOnce(&'g mut DeviceGroup<'a, T>) -> &'g mut DeviceGroup<'a, T>,
    ) -> Result<()> {
        let mut g = self.device_group(stream);
        add(&mut g);
        g.run()
    }

    /// Starts a group of device sends and receives of `T` on `stream` (see [`DeviceGroup`]).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// // A ring shift: one kernel sends to the next rank and receives from the previous one.
    /// let (me, n) = (comm.rank(), comm.world_size());
    /// let mine = stream.clone_htod(&[me as i32; 256])?;
    /// let mut theirs = stream.alloc_zeros::<i32>(256)?;
    /// let mut g = comm.device_group(stream);
    /// g.send(&mine, (me + 1) % n).recv(&mut theirs, (me + n - 1) % n);
    /// g.run()?;
    /// # Ok(()) }
    /// ```
    pub fn device_group<'a, T: Element>(&'a self, stream: &'a Arc<CudaStream>) -> DeviceGroup<'a, T> {
        DeviceGroup { comm: self, stream, sends: Vec::new(), recvs: Vec::new() }
    }
}

/// Device sends and receives of `T` on one stream, built by [`Communicator::device_group`];
/// nothing is checked or launched until [`run`](Self::run), which enqueues them as
/// [`Communicator::group_device_raw`] does: in an order that cannot deadlock, each message
/// stamped so that a send nobody received is never taken for a later one.
pub struct DeviceGroup<'a, T: Element> {
    comm: &'a Communicator,
    stream: &'a Arc<CudaStream>,
    sends: Vec<(&'a dyn DevicePtr<T>, usize)>,
    recvs: Vec<(&'a mut dyn DevicePtrMut<T>, usize)>,
}

impl<'a, T: Element> DeviceGroup<'a, T> {
    /// Adds a send of `buf` to `peer`.
    pub fn send<S: DevicePtr<T> + 'a>(&mut self, buf: &'a S, peer: usize) -> &mut Self {
        self.sends.push((buf, peer));
        self
    }

    /// Adds a receive of exactly `buf.len()` elements from `peer` into `buf`.
    pub fn recv<R: DevicePtrMut<T> + 'a>(&mut self, buf: &'a mut R, peer: usize) -> &mut Self {
        self.recvs.push((buf, peer));
        self
    }

    /// Checks every peer, then enqueues the group (as
    /// [`group_device_raw`](Communicator::group_device_raw) schedules it: whatever the order
    /// of its sends and receives, it cannot deadlock; nothing waits for the GPU). A failed
    /// check launches nothing; a failure while enqueueing leaves the kernels before it
    /// enqueued (the communicator's GPU path is then unusable, as after any failed launch).
    pub fn run(self) -> Result<()> {
        const CALL: &str = "device group";
        let (me, n) = (self.comm.rank(), self.comm.world_size());
        for &(_, to) in &self.sends {
            checks::peer(CALL, "send to", to, me, n)?;
        }
        for (_, from) in &self.recvs {
            checks::peer(CALL, "receive from", *from, me, n)?;
        }
        let esz = std::mem::size_of::<T>();
        let mut buffers = self.comm.device_buffers(CALL, self.stream)?;
        let mut ops = Vec::with_capacity(self.sends.len() + self.recvs.len());
        for (buf, peer) in self.sends {
            ops.push(DeviceTransfer::Send { addr: buffers.read("a send buffer", buf)?, bytes: buf.len() * esz, peer });
        }
        for (buf, peer) in self.recvs {
            let bytes = buf.len() * esz;
            ops.push(DeviceTransfer::Recv { addr: buffers.write("a receive buffer", buf)?, bytes, peer });
        }
        // SAFETY: each address comes with its buffer's length in bytes, the buffers are on this
        // GPU and guarded until `buffers` drops after the launches.
        unsafe { self.comm.group_device_raw(&ops, self.stream) }
    }
}
