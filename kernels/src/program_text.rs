//! The text of weave's NVRTC programs, from `std` alone: the embedded device headers, how a
//! program is put together, and the direct family's sources, entry points and launch constants.
//!
//! The crate ([`crate::source`], [`crate::direct`]) and its build script (`build.rs`, which
//! compiles the direct program ahead of time when NVRTC is there) both build programs with this
//! module, so an image compiled at build time is of the very text the crate would compile at
//! run time; [`fingerprint`] names that text, and an embedded image is used only when its
//! fingerprint is the one of [`crate::direct::program`] ([`crate::embedded`]).

/// `(include name, contents)` of each named file of `kernels/cuda/weave/`, embedded: the include
/// name is the file's name under `weave/`, so each header is named once.
macro_rules! weave_headers {
    ($($file:literal),* $(,)?) => {
        &[$((concat!("weave/", $file), include_str!(concat!("../cuda/weave/", $file)))),*]
    };
}

/// Every device header, as `(include name, contents)`. Every NVRTC program gets all of them.
pub const HEADERS: &[(&str, &str)] = weave_headers![
    "types.cuh",
    "handles.cuh",
    "atomics.cuh",
    "status.cuh",
    "semaphore.cuh",
    "copy.cuh",
    "packet.cuh",
    "fifo.cuh",
    "memory_channel.cuh",
    "port_channel.cuh",
    "dtype.cuh",
    "fp8.cuh",
    "reduce.cuh",
    "weave.cuh"
];

/// The file name NVRTC reports for the kernel's own source in messages.
pub const KERNEL_FILE_NAME: &str = "kernel.cu";

/// A complete NVRTC program: `#include "weave/weave.cuh"`, then `extra_source` (reported as
/// [`KERNEL_FILE_NAME`] from line 1), then `checks` (C++ `static_assert`s).
pub fn program_with_checks(extra_source: &str, checks: &str) -> String {
    let mut s = String::with_capacity(extra_source.len() + checks.len() + 128);
    s.push_str("#include \"weave/weave.cuh\"\n");
    s.push_str(&format!("#line 1 \"{KERNEL_FILE_NAME}\"\n"));
    s.push_str(extra_source);
    if !extra_source.ends_with('\n') {
        s.push('\n');
    }
    s.push_str("#line 1 \"weave-generated-checks\"\n");
    s.push_str(checks);
    s
}

/// The element types of the reducing kernels: (Rust name, C++ type in `weave/dtype.cuh`).
pub const REDUCING_TYPES: [(&str, &str); 10] = [
    ("f64", "double"),
    ("f32", "float"),
    ("f16", "weave::half_t"),
    ("bf16", "weave::bf16_t"),
    ("i64", "weave::int64_t"),
    ("i32", "weave::int32_t"),
    ("u64", "weave::uint64_t"),
    ("u32", "weave::uint32_t"),
    ("i8", "weave::int8_t"),
    ("u8", "weave::uint8_t"),
];

/// Every reduction operator of a reducing kernel: the mask `WEAVE_REDUCE_OPS` takes
/// (`weave/reduce.cuh`), bit `1 << code` per operator code (sum and average share bit 0).
pub const ALL_REDUCE_OPS: u32 = 0b1111;

/// The `WEAVE_REDUCE_OPS` bit of the operator code `op` (sum 0, prod 1, min 2, max 3, avg 4):
/// average is a sum divided at the end, so it shares the sum's bit. `None` for an unknown code.
pub fn reduce_op_bit(op: u32) -> Option<u32> {
    match op {
        0 | 4 => Some(1),
        1..=3 => Some(1 << op),
        _ => None,
    }
}

/// Threads per block of every direct collective kernel.
pub const BLOCK_THREADS: u32 = 512;

/// Most blocks of a block-pipelined kernel (`PIPE_MAX_BLOCKS` in `pipeline.cu`, defined from
/// this one by the program builder).
pub const PIPE_MAX_BLOCKS: u32 = 128;

/// Slot groups per block of a block-pipelined kernel (`PIPE_DEPTH` in `pipeline.cu`): step s
/// uses group s mod `PIPE_DEPTH`, so a block may push up to this many steps ahead of a peer's
/// reads.
pub const PIPE_DEPTH: usize = 4;

/// Flag kinds of the pipelined kernels per block and writer (inbox ready, results ready, freed).
const PIPE_FLAG_KINDS: usize = 3;

/// Bytes of the pipelined kernels' flag words (a u64 per block, kind and writer, up to 8
/// writers).
pub const PIPE_FLAGS_BYTES: usize = PIPE_MAX_BLOCKS as usize * PIPE_FLAG_KINDS * 8 * 8;

/// Most blocks of an LL packet kernel (`PACKET_MAX_BLOCKS` in `collectives.cu`: one packet
/// epoch counter per block index, at most 64 in the control block).
pub const PACKET_MAX_BLOCKS: u32 = 64;

/// The direct kernels' CUDA C++ source: the flag-based kernels and shared helpers, the byte and
/// point-to-point kernels, the LL packet exchange of the data-movement collectives, and the
/// block-pipelined kernels, and the all-reduce over windows, in that order.
pub const COLLECTIVES_SOURCE: &str = concat!(
    include_str!("../cuda/collectives.cu"),
    "\n",
    include_str!("../cuda/data_movement.cu"),
    "\n",
    include_str!("../cuda/exchange_ll.cu"),
    "\n",
    include_str!("../cuda/pipeline.cu"),
    "\n",
    include_str!("../cuda/windowed.cu"),
);

/// How the entry points of a direct kernel family are made from its body in the sources.
#[derive(Debug, Clone, Copy)]
enum EntryPoint {
    /// `weave_<kernel>_<type>` for every reducing element type ([`REDUCING_TYPES`]), through
    /// `WEAVE_REDUCING_KERNEL` with the body template `IMPL<Op, T>`.
    Reducing { kernel: &'static str, body: &'static str },
    /// One entry point `weave_<kernel>` running `body(a)`.
    Plain { kernel: &'static str, body: &'static str },
}

/// Every entry point of the direct program, family by family.
const ENTRY_POINTS: &[EntryPoint] = &[
    reducing("all_reduce_ll", "AllReduceLL"),
    reducing("all_reduce_two_shot", "AllReduceTwoShot"),
    reducing("all_reduce_two_shot_ll128", "AllReduceTwoShotLl128"),
    reducing("reduce", "Reduce"),
    plain("all_to_allv", "weave::coll::all_to_allv"),
    plain("sendrecv", "weave::coll::sendrecv"),
    reducing("reduce_scatter_ll", "ReduceScatterLL"),
    reducing("reduce_ll", "ReduceLL"),
    plain("all_gather_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_ALL_GATHER>"),
    plain("all_to_all_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_ALL_TO_ALL>"),
    plain("broadcast_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_BROADCAST>"),
    reducing("all_reduce_pipelined", "AllReducePipelined"),
    reducing("reduce_scatter_pipelined", "ReduceScatterPipelined"),
    reducing("all_reduce_windowed", "AllReduceWindowed"),
    plain("broadcast_chain", "weave::coll::broadcast_chain"),
    plain("broadcast_pipelined", "weave::coll::broadcast_relay"),
    plain("all_gather_pipelined", "weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_GATHER>"),
    plain("all_to_all_pipelined", "weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_TO_ALL>"),
];

/// A reducing family's entry points ([`EntryPoint::Reducing`]).
const fn reducing(kernel: &'static str, body: &'static str) -> EntryPoint {
    EntryPoint::Reducing { kernel, body }
}

/// A family of one entry point ([`EntryPoint::Plain`]).
const fn plain(kernel: &'static str, body: &'static str) -> EntryPoint {
    EntryPoint::Plain { kernel, body }
}

impl EntryPoint {
    /// The source lines defining this family's entry points whose names `wanted` accepts.
    fn lines(self, wanted: &dyn Fn(&str) -> bool) -> String {
        match self {
            EntryPoint::Reducing { kernel, body } => REDUCING_TYPES
                .iter()
                .filter(|(t, _)| wanted(&format!("weave_{kernel}_{t}")))
                .map(|(t, c)| format!("WEAVE_REDUCING_KERNEL({kernel}, {body}, {t}, {c})\n"))
                .collect(),
            EntryPoint::Plain { kernel, body } if wanted(&format!("weave_{kernel}")) => {
                format!("WEAVE_KERNEL(weave_{kernel}, {body})\n")
            }
            EntryPoint::Plain { .. } => String::new(),
        }
    }
}

/// The names of every entry point of the direct program (`weave_all_reduce_ll_f32`, …).
pub fn direct_kernel_names() -> Vec<String> {
    ENTRY_POINTS
        .iter()
        .flat_map(|e| match *e {
            EntryPoint::Reducing { kernel, .. } => {
                REDUCING_TYPES.iter().map(|(t, _)| format!("weave_{kernel}_{t}")).collect::<Vec<_>>()
            }
            EntryPoint::Plain { kernel, .. } => vec![format!("weave_{kernel}")],
        })
        .collect()
}

/// Whether the direct program has an entry point named `name`.
pub fn has_direct_kernel(name: &str) -> bool {
    ENTRY_POINTS.iter().any(|e| !e.lines(&|n| n == name).is_empty())
}

/// The direct program: the reduction operators `ops` ([`ALL_REDUCE_OPS`] or a
/// [`reduce_op_bit`]), the launch constants, the collective sources, the entry points `wanted`
/// accepts, then `checks`.
pub fn direct_program(checks: &str, wanted: &dyn Fn(&str) -> bool, ops: u32) -> String {
    let entries: String = ENTRY_POINTS.iter().map(|e| e.lines(wanted)).collect();
    let source = format!(
        "#define WEAVE_BLOCK_THREADS {BLOCK_THREADS}\n#define WEAVE_PIPE_MAX_BLOCKS {PIPE_MAX_BLOCKS}\n\
         #define WEAVE_PIPE_FLAGS_BYTES {PIPE_FLAGS_BYTES}\n#define WEAVE_PIPE_DEPTH {PIPE_DEPTH}\n\
         #define WEAVE_PACKET_MAX_BLOCKS {PACKET_MAX_BLOCKS}\n{COLLECTIVES_SOURCE}\n{entries}"
    );
    let program = program_with_checks(&source, checks);
    if ops == ALL_REDUCE_OPS { program } else { format!("#define WEAVE_REDUCE_OPS {ops}\n{program}") }
}

/// 128-bit FNV-1a, fed field by field (each field followed by its length, so boundaries count).
pub struct Fnv128(pub u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    /// The empty hash.
    pub fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// Adds one field.
    pub fn field(&mut self, data: &[u8]) -> &mut Self {
        self.bytes(data);
        self.bytes(&(data.len() as u64).to_le_bytes());
        self
    }
}

/// What names a program's text for the embedded images: a hash of the program and of every
/// header it may include.
pub fn fingerprint(program: &str) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"weave program fingerprint v1").field(program.as_bytes());
    for (name, text) in HEADERS {
        h.field(name.as_bytes()).field(text.as_bytes());
    }
    h.0
}
