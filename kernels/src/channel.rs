//! The channel kernel family (`cuda/channel.cu`): every collective on device buffers over port
//! channels — the kernel stages messages in its own memory and pushes triggers; the proxy's
//! connections carry them to the peers. This module owns the family's argument block, its link
//! table entry, its kernel names and its program; the executor that builds links and launches
//! lives in `collectives` (`gpu/channels.rs`).

use comm_core::device::{DeviceStatusHandle, Layout};
use comm_core::device_layout;
use comm_core::fifo::FifoDeviceHandle;

use crate::layout::layout_checks;
use crate::source::program_with_checks;

/// The family's CUDA C++ source (standalone: it includes the weave headers through
/// [`ChannelKernel::program`]).
pub const CHANNEL_SOURCE: &str = include_str!("../cuda/channel.cu");

/// The family's logarithmic algorithms (`cuda/channel_log.cu`: recursive doubling and halving,
/// Bruck, binomial trees), which every program appends to [`CHANNEL_SOURCE`].
pub const CHANNEL_LOG_SOURCE: &str = include_str!("../cuda/channel_log.cu");

/// Each collective dispatched to its algorithm, and the entry points (`cuda/channel_run.cu`),
/// which every program appends to [`CHANNEL_LOG_SOURCE`].
pub const CHANNEL_RUN_SOURCE: &str = include_str!("../cuda/channel_run.cu");

/// Threads of the one block a channel launch runs.
pub const CHANNEL_THREADS: u32 = 512;

/// The byte kernel: data movement (all-gather, broadcast, all-to-all(v), send/receive).
pub const BYTES_KERNEL: &str = "weave_channel_bytes";

/// The reducing kernels' prefix: `weave_channel_<type>` with the type's Rust name.
pub const REDUCING_KERNEL_PREFIX: &str = "weave_channel";

/// The element types of the reducing kernels: (Rust name, C++ type in `weave/dtype.cuh`).
pub use crate::program_text::REDUCING_TYPES;

/// One kernel of the family, compiled as a program of its own the first time it is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelKernel {
    /// [`BYTES_KERNEL`]: data movement, counts in bytes.
    Moving,
    /// `weave_channel_<type>`: the reducing collectives on one element type (its Rust name, one
    /// of [`REDUCING_TYPES`]).
    Reducing(&'static str),
}

impl std::fmt::Display for ChannelKernel {
    /// The entry point's name.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelKernel::Moving => f.write_str(BYTES_KERNEL),
            ChannelKernel::Reducing(t) => write!(f, "{REDUCING_KERNEL_PREFIX}_{t}"),
        }
    }
}

impl ChannelKernel {
    /// The entry point's name.
    pub fn name(self) -> String {
        self.to_string()
    }

    /// The NVRTC program that defines this kernel alone: headers, the block size, the family's
    /// code, the entry point, and the layout checks of every comm-core handle and of
    /// [`LAYOUTS`]. `Err(InvalidArgument)` for an element type the family does not have.
    pub fn program(self) -> comm_core::Result<String> {
        let entry = match self {
            ChannelKernel::Moving => "WEAVE_CHANNEL_MOVING()".to_string(),
            ChannelKernel::Reducing(t) => {
                let (_, c_type) = REDUCING_TYPES.iter().find(|(name, _)| *name == t).ok_or_else(|| {
                    comm_core::Error::invalid(format!("the channel kernels have no reducing kernel for {t:?}"))
                })?;
                format!("WEAVE_CHANNEL_REDUCING({t}, {c_type})")
            }
        };
        let checks = crate::layout::static_checks() + &layout_checks(&LAYOUTS) + &constant_checks();
        let source = format!(
            "#define WEAVE_CHANNEL_THREADS {CHANNEL_THREADS}\n{}#line 1 \"channel.cu\"\n{CHANNEL_SOURCE}\n\
             #line 1 \"channel_log.cu\"\n{CHANNEL_LOG_SOURCE}\n#line 1 \"channel_run.cu\"\n{CHANNEL_RUN_SOURCE}\n{entry}\n",
            code_declarations()
        );
        Ok(program_with_checks(&source, &checks))
    }
}

/// A rank number that names no peer (`CHANNEL_NO_PEER`).
pub const NO_PEER: u32 = u32::MAX;

/// Bytes of a link region before its first slot (the `ready` and `freed` words, padded).
pub const SLOTS_OFFSET: usize = 4096;
/// Offset of the `ready` word in a link region.
pub const READY_OFFSET: usize = 0;
/// Offset of the `freed` word in a link region.
pub const FREED_OFFSET: usize = 64;
/// Bytes of the header in front of every message.
pub const HEADER_BYTES: usize = 64;

/// Collective codes of [`ChannelArgs::collective`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ChannelCollective {
    /// All-reduce.
    AllReduce = 0,
    /// All-gather.
    AllGather = 1,
    /// Reduce-scatter.
    ReduceScatter = 2,
    /// Broadcast.
    Broadcast = 3,
    /// Reduce.
    Reduce = 4,
    /// All-to-all.
    AllToAll = 5,
    /// All-to-all-v.
    AllToAllv = 6,
    /// Send and/or receive.
    SendRecv = 7,
}

/// Algorithm codes of [`ChannelArgs::algorithm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ChannelAlgorithm {
    /// Ring (chains for broadcast and reduce).
    Ring = 0,
    /// One-hop lockstep exchanges.
    Direct = 1,
    /// All-reduce by recursive doubling (`cuda/channel_log.cu`).
    Doubling = 2,
    /// All-reduce (Rabenseifner) and reduce-scatter by recursive halving.
    Halving = 3,
    /// All-gather and all-to-all by Bruck's algorithms.
    Bruck = 4,
    /// Broadcast and reduce over a binomial tree.
    Tree = 5,
}

impl ChannelCollective {
    /// Every collective code.
    pub const ALL: [ChannelCollective; 8] = [
        ChannelCollective::AllReduce,
        ChannelCollective::AllGather,
        ChannelCollective::ReduceScatter,
        ChannelCollective::Broadcast,
        ChannelCollective::Reduce,
        ChannelCollective::AllToAll,
        ChannelCollective::AllToAllv,
        ChannelCollective::SendRecv,
    ];
}

impl ChannelAlgorithm {
    /// Every algorithm code.
    pub const ALL: [ChannelAlgorithm; 6] = [
        ChannelAlgorithm::Ring,
        ChannelAlgorithm::Direct,
        ChannelAlgorithm::Doubling,
        ChannelAlgorithm::Halving,
        ChannelAlgorithm::Bruck,
        ChannelAlgorithm::Tree,
    ];
}

/// The C++ declarations of the codes `channel.cu` shares with this module, made from the Rust
/// definitions and put in front of the family's source by [`ChannelKernel::program`]:
/// `enum ChannelCollective` and `enum ChannelAlgorithm` in `weave`, each code named
/// `CHANNEL_<VARIANT>` (`ChannelCollective::AllToAllv` is `CHANNEL_ALL_TO_ALLV`), and
/// `CHANNEL_NO_PEER` ([`NO_PEER`]).
pub fn code_declarations() -> String {
    let collectives = ChannelCollective::ALL.map(|c| (format!("{c:?}"), c as u32));
    let algorithms = ChannelAlgorithm::ALL.map(|a| (format!("{a:?}"), a as u32));
    format!(
        "// Generated by kernels::channel from the Rust definitions; do not edit.\nnamespace weave {{\n{}{}\
         constexpr uint32_t CHANNEL_NO_PEER = {NO_PEER:#x}u;\n}}  // namespace weave\n",
        cuda_enum("ChannelCollective", &collectives),
        cuda_enum("ChannelAlgorithm", &algorithms)
    )
}

/// `enum name : uint32_t { CHANNEL_<CODE> = value, ... };` with each variant's name in
/// upper snake case.
fn cuda_enum(name: &str, variants: &[(String, u32)]) -> String {
    let codes: Vec<String> =
        variants.iter().map(|(v, value)| format!("CHANNEL_{} = {value}", upper_snake(v))).collect();
    format!("enum {name} : uint32_t {{ {} }};\n", codes.join(", "))
}

/// `AllToAllv` as `ALL_TO_ALLV`: an underscore before every upper-case letter but the first.
fn upper_snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
    }
    s
}

/// The argument block of every channel kernel, mirrored by `weave::ChannelArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelArgs {
    /// Local input (device address).
    pub send: u64,
    /// Local output (device address).
    pub recv: u64,
    /// Elements (reducing kernels) or bytes (the byte kernel).
    pub count: u64,
    /// All-to-all-v: device arrays of `u64` element counts per rank (send counts, send
    /// displacements, recv counts, recv displacements). Send/receive: `aux[0]` is the number of
    /// bytes to receive.
    pub aux: [u64; 4],
    /// Device address of the link table (a [`ChannelLink`] per rank).
    pub links: u64,
    /// Device address of the logarithmic algorithms' work buffer, as large as the call needs
    /// (0 where it needs none).
    pub scratch: u64,
    /// The call's number (every rank counts channel calls alike; 0 for send/receive).
    pub call: u64,
    /// Collective, algorithm, element type, operator and root, packed: every rank must agree.
    pub signature: u64,
    /// The element count every rank must agree on (0 where counts are per pair).
    pub agreed: u64,
    /// The proxy's trigger FIFO.
    pub fifo: FifoDeviceHandle,
    /// Where the kernel reports that it gave up.
    pub status: DeviceStatusHandle,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Root rank (broadcast, reduce); send/receive: the rank to send to, or [`NO_PEER`].
    pub root: u32,
    /// Operator code: sum 0, prod 1, min 2, max 3, avg 4.
    pub op: u32,
    /// A [`ChannelCollective`] code.
    pub collective: u32,
    /// A [`ChannelAlgorithm`] code.
    pub algorithm: u32,
    /// Send/receive: the rank to receive from, or [`NO_PEER`].
    pub from: u32,
    /// Bytes of one element.
    pub elem_size: u32,
}

// SAFETY: plain #[repr(C)] data of u64/u32 fields and two plain handles, mirrored field for
// field by weave::ChannelArgs and checked by the generated layout asserts in every compile.
unsafe impl cudarc::driver::DeviceRepr for ChannelArgs {}

/// One rank's side of a link as kernels see it, mirrored by `weave::ChannelLink`: written once by
/// the host when the link is built; the counters are then the kernels' own.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelLink {
    /// Device address of this rank's region of the link (the peer writes into it).
    pub inbox: u64,
    /// Device address of this rank's private staging region (same layout).
    pub outbox: u64,
    /// Messages posted to the peer so far.
    pub posted: u64,
    /// Messages of the peer consumed so far.
    pub consumed: u64,
    /// Proxy semaphore id raising `ready` in the peer's region.
    pub data_semaphore: u32,
    /// Proxy semaphore id raising `freed` in the peer's region.
    pub credit_semaphore: u32,
    /// Proxy memory id of the outbox.
    pub outbox_memory: u32,
    /// Proxy memory id of the peer's region.
    pub peer_memory: u32,
    /// Slots per direction.
    pub slots: u32,
    /// Header and payload bytes of one slot (a multiple of 64).
    pub slot_bytes: u32,
    /// The peer's rank.
    pub peer: u32,
    /// 1 once built.
    pub built: u32,
    /// The peer's region of the link as mapped into this GPU, where a transport maps it (CUDA
    /// IPC): the kernels then write messages and tokens into it themselves (a memory channel);
    /// 0: through the proxy (a port channel).
    pub peer_region: u64,
}

/// Bytes of one link table entry (a [`ChannelLink`]); the table holds one per rank.
pub const LINK_BYTES: usize = std::mem::size_of::<ChannelLink>();
const _: () = assert!(LINK_BYTES == 72);

impl ChannelLink {
    /// The entry's bytes, as the device table holds them (little-endian, like the GPU).
    pub fn to_bytes(&self) -> [u8; LINK_BYTES] {
        let mut b = [0u8; LINK_BYTES];
        let words64 = [self.inbox, self.outbox, self.posted, self.consumed];
        for (i, w) in words64.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let words32 = [
            self.data_semaphore,
            self.credit_semaphore,
            self.outbox_memory,
            self.peer_memory,
            self.slots,
            self.slot_bytes,
            self.peer,
            self.built,
        ];
        for (i, w) in words32.iter().enumerate() {
            b[32 + 4 * i..36 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[64..72].copy_from_slice(&self.peer_region.to_le_bytes());
        b
    }
}

/// The layouts the C++ side must match.
pub const LAYOUTS: [Layout; 2] = [
    device_layout!(
        ChannelArgs,
        "ChannelArgs",
        [
            send, recv, count, aux, links, scratch, call, signature, agreed, fifo, status, rank, world, root, op,
            collective, algorithm, from, elem_size
        ]
    ),
    device_layout!(
        ChannelLink,
        "ChannelLink",
        [
            inbox,
            outbox,
            posted,
            consumed,
            data_semaphore,
            credit_semaphore,
            outbox_memory,
            peer_memory,
            slots,
            slot_bytes,
            peer,
            built,
            peer_region
        ]
    ),
];

/// `static_assert`s tying the region layout of `channel.cu` to the constants here (its codes are
/// declared from this module: [`code_declarations`]).
fn constant_checks() -> String {
    let mut s = String::new();
    for (name, value) in [
        ("::weave::chan::SLOTS_OFFSET", SLOTS_OFFSET as u64),
        ("::weave::chan::READY", READY_OFFSET as u64),
        ("::weave::chan::FREED", FREED_OFFSET as u64),
        ("::weave::chan::HEADER_BYTES", HEADER_BYTES as u64),
    ] {
        s.push_str(&format!(
            "static_assert({name} == {value}ull, \"weave drift: {name} differs from Rust ({value})\");\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_entries_encode_field_by_field() {
        let l = ChannelLink {
            inbox: 1,
            outbox: 2,
            posted: 3,
            consumed: 4,
            data_semaphore: 5,
            credit_semaphore: 6,
            outbox_memory: 7,
            peer_memory: 8,
            slots: 9,
            slot_bytes: 10,
            peer: 11,
            built: 1,
            peer_region: 12,
        };
        let b = l.to_bytes();
        for (name, offset) in LAYOUTS[1].fields {
            let wide = *offset < 32 || *offset >= 64;
            let v = if wide {
                u64::from_le_bytes(b[*offset..*offset + 8].try_into().unwrap())
            } else {
                u64::from(u32::from_le_bytes(b[*offset..*offset + 4].try_into().unwrap()))
            };
            assert_ne!(v, 0, "{name} at {offset} was not written");
        }
        assert_eq!(b[60..64], 1u32.to_le_bytes());
    }

    #[test]
    fn codes_are_declared_as_channel_cu_names_them() {
        let d = code_declarations();
        for code in [
            "CHANNEL_ALL_REDUCE = 0,",
            "CHANNEL_REDUCE_SCATTER = 2,",
            "CHANNEL_ALL_TO_ALLV = 6,",
            "CHANNEL_SEND_RECV = 7 };",
            "enum ChannelAlgorithm : uint32_t { CHANNEL_RING = 0, CHANNEL_DIRECT = 1, CHANNEL_DOUBLING = 2, \
             CHANNEL_HALVING = 3, CHANNEL_BRUCK = 4, CHANNEL_TREE = 5 };",
            "constexpr uint32_t CHANNEL_NO_PEER = 0xffffffffu;",
        ] {
            assert!(d.contains(code), "{code} missing from\n{d}");
        }
        for c in ChannelCollective::ALL {
            assert!(CHANNEL_RUN_SOURCE.contains(&format!("CHANNEL_{}", upper_snake(&format!("{c:?}")))), "{c:?}");
        }
        for a in ChannelAlgorithm::ALL {
            assert!(CHANNEL_RUN_SOURCE.contains(&format!("CHANNEL_{}", upper_snake(&format!("{a:?}")))), "{a:?}");
        }
    }

    /// Every kernel of the family compiles for sm_90 with every layout check (the moving
    /// kernel and one reducing kernel per element type, each a program of its own). Without
    /// NVRTC this fails under `CI` and prints SKIPPED elsewhere.
    #[test]
    fn channel_kernels_compile_for_sm_90_with_layout_checks() {
        if !crate::compile::tests::nvrtc_or_skip("channel_kernels_compile") {
            return;
        }
        let kernels = std::iter::once(ChannelKernel::Moving)
            .chain(REDUCING_TYPES.iter().map(|(t, _)| ChannelKernel::Reducing(t)));
        for k in kernels {
            let compiled = crate::compile::Compiler::without_cache()
                .compile(&k.program().unwrap(), "sm_90")
                .unwrap_or_else(|e| panic!("{} does not compile: {e}", k.name()));
            let ptx = compiled.ptx();
            assert!(ptx.contains(&format!(".entry {}(", k.name())), "{} missing from its PTX", k.name());
            // The logarithmic algorithms are real functions of every program (channel_log.cu).
            let steps: &[&str] = match k {
                ChannelKernel::Moving => &["bruck_all_gather", "bruck_all_to_all", "tree_broadcast"],
                ChannelKernel::Reducing(_) => &["doubling", "halving", "tree_reduce"],
            };
            for step in steps {
                assert!(ptx.contains(step), "{} lacks {step}", k.name());
            }
        }
        assert!(ChannelKernel::Reducing("f128").program().is_err());
    }
}
